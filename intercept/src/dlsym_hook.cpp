// Interposing dlsym. dlsym(handle, "cuLaunchKernelEx") on libcuda's handle never looks at
// LD_PRELOAD libraries, so Triton-style callers would miss the shim; we export dlsym under both
// glibc versions (dlsym@GLIBC_2.2.5 for old binaries, dlsym@@GLIBC_2.34 for new ones) and hand out
// our wrapper whenever the real lookup finds a wrapped cu* symbol.
//
// glibc's dlsym looks at its return address to know who is asking (RTLD_NEXT, and RTLD_DEFAULT
// from libraries opened RTLD_LOCAL depend on it). So on x86-64 the exported entry is a small
// assembly stub: it asks orion_dlsym_route() whether the shim answers, and otherwise *jumps* to
// glibc's dlsym with the caller's return address still on the stack. Only wrapped cu* names are
// looked up by the shim itself (there the caller's identity does not change the answer).
//
// Sanitizer runtimes resolve their interceptors with dlsym(RTLD_NEXT, ...) before they are
// initialised, so this file (and the entry table it reads) is compiled without sanitizers.
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <iterator>

#include "driver_functions.h"
#include "real_driver.h"

namespace orion {
namespace {
// Every driver-header symbol (generated, sorted by symbol); the wrapper is the shim's definition.
constinit const DriverFunction kDriverFunctions[] = {
#define ORION_DRIVER_FUNCTION(base, sym, lo, hi, pt, cls, hand) \
  {{#base, #sym, lo, hi, pt != 0, reinterpret_cast<void*>(&::sym)}, CallClass::cls, hand != 0},
#include "driver_functions.inc"
#undef ORION_DRIVER_FUNCTION
};
static_assert(std::size(kDriverFunctions) == static_cast<size_t>(DriverFunctionId::kCount));
// Constant-initialised: consulted before any constructor has run.
constinit const EntryInfo kEntries[] = {
#define ORION_ENTRY(base, sym, pfn, lo, hi, pt) \
  {#base, #sym, lo, hi, pt != 0, reinterpret_cast<void*>(&::sym)},
#define ORION_ALIAS(base, sym, lo, hi, pt) {#base, #sym, lo, hi, pt != 0, reinterpret_cast<void*>(&::sym)},
#include "entry_points.def"
#undef ORION_ALIAS
#undef ORION_ENTRY
};
constexpr size_t kAliases = 0
#define ORION_ENTRY(base, sym, pfn, lo, hi, pt)
#define ORION_ALIAS(base, sym, lo, hi, pt) +1
#include "entry_points.def"
#undef ORION_ALIAS
#undef ORION_ENTRY
    ;
static_assert(std::size(kEntries) == static_cast<size_t>(Entry::kCount) + kAliases);
}  // namespace
std::span<const EntryInfo> entry_table() { return kEntries; }
std::span<const DriverFunction> driver_functions() { return kDriverFunctions; }
const DriverFunction* find_driver_function(const char* symbol) {
  if (symbol == nullptr) return nullptr;
  size_t lo = 0, hi = std::size(kDriverFunctions);
  while (lo < hi) {  // no std:: algorithms: this runs uninstrumented, maybe before constructors
    const size_t mid = lo + (hi - lo) / 2;
    const int c = std::strcmp(kDriverFunctions[mid].entry.symbol, symbol);
    if (c == 0) return &kDriverFunctions[mid];
    if (c < 0) lo = mid + 1; else hi = mid;
  }
  return nullptr;
}
}  // namespace orion

namespace {

using DlsymFn = void* (*)(void*, const char*);

std::atomic<DlsymFn> g_glibc_dlsym[2];  // [0] GLIBC_2.2.5, [1] GLIBC_2.34
constexpr const char* kGlibcVersion[2] = {"GLIBC_2.2.5", "GLIBC_2.34"};
// initial-exec: no __tls_get_addr call, which sanitizers intercept before they are ready.
__attribute__((tls_model("initial-exec"))) thread_local bool t_resolving = false;

DlsymFn glibc_dlsym(int version_index) {
  DlsymFn fn = g_glibc_dlsym[version_index].load(std::memory_order_acquire);
  if (fn != nullptr || t_resolving) return fn;
  t_resolving = true;
  fn = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", kGlibcVersion[version_index]));
  if (fn == nullptr) {  // a libc that only has one of the two versions
    fn = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", kGlibcVersion[1 - version_index]));
  }
  t_resolving = false;
  g_glibc_dlsym[version_index].store(fn, std::memory_order_release);
  return fn;
}

// Every cu* symbol the driver headers declare has a wrapper (hand-written or generated).
const orion::EntryInfo* find_wrapped_symbol(const char* name) {
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return nullptr;
  const orion::DriverFunction* f = orion::find_driver_function(name);
  return f ? &f->entry : nullptr;
}

}  // namespace

namespace orion {
void* real_dlsym(void* handle, const char* name) {
  DlsymFn fn = glibc_dlsym(1);
  return fn ? fn(handle, name) : nullptr;
}
}  // namespace orion

// Returns the shim's wrapper when it answers the lookup, else nullptr with *forward set to the
// glibc dlsym the caller's request should go to.
extern "C" __attribute__((visibility("hidden"), used)) void* orion_dlsym_route(
    void* handle, const char* name, int version_index, void** forward) {
  DlsymFn real = glibc_dlsym(version_index);
  *forward = reinterpret_cast<void*>(real);
  // RTLD_NEXT is relative to the caller: another interposer asking for "the next cuLaunchKernel"
  // must get the driver's, not ours.
  if (real == nullptr || handle == RTLD_NEXT) return nullptr;
  const orion::EntryInfo* entry = find_wrapped_symbol(name);
  if (entry == nullptr) return nullptr;
  // Only replace what the library really has (a driver without cuLaunchKernelEx stays without).
  if (real(handle, name) == nullptr) return nullptr;
  return entry->wrapper;
}

#if defined(__x86_64__)
// See the file comment: route, then either return the wrapper or tail-jump to glibc.
asm(R"(
    .text
    .p2align 4
    .globl orion_dlsym_entry_225
    .type orion_dlsym_entry_225, @function
orion_dlsym_entry_225:
    .cfi_startproc
    xorl %edx, %edx
    jmp orion_dlsym_common
    .cfi_endproc
    .size orion_dlsym_entry_225, .-orion_dlsym_entry_225

    .p2align 4
    .globl orion_dlsym_entry_234
    .type orion_dlsym_entry_234, @function
orion_dlsym_entry_234:
    .cfi_startproc
    movl $1, %edx
    jmp orion_dlsym_common
    .cfi_endproc
    .size orion_dlsym_entry_234, .-orion_dlsym_entry_234

    .p2align 4
    .type orion_dlsym_common, @function
orion_dlsym_common:
    .cfi_startproc
    pushq %rdi
    .cfi_adjust_cfa_offset 8
    pushq %rsi
    .cfi_adjust_cfa_offset 8
    subq $24, %rsp
    .cfi_adjust_cfa_offset 24
    movq $0, (%rsp)
    movq %rsp, %rcx
    call orion_dlsym_route
    movq (%rsp), %r11
    addq $24, %rsp
    .cfi_adjust_cfa_offset -24
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    testq %rax, %rax
    jnz 1f
    testq %r11, %r11
    jz 1f
    jmp *%r11
1:
    ret
    .cfi_endproc
    .size orion_dlsym_common, .-orion_dlsym_common
)");
#else
// Portable fallback: correct answers for handles and RTLD_DEFAULT from the main program; an
// RTLD_NEXT lookup is answered relative to the shim instead of the caller.
extern "C" void* orion_dlsym_entry_225(void* handle, const char* name) {
  void* forward = nullptr;
  void* ours = orion_dlsym_route(handle, name, 0, &forward);
  if (ours != nullptr || forward == nullptr) return ours;
  return reinterpret_cast<DlsymFn>(forward)(handle, name);
}
extern "C" void* orion_dlsym_entry_234(void* handle, const char* name) {
  void* forward = nullptr;
  void* ours = orion_dlsym_route(handle, name, 1, &forward);
  if (ours != nullptr || forward == nullptr) return ours;
  return reinterpret_cast<DlsymFn>(forward)(handle, name);
}
#endif

// Exported as dlsym in both glibc versions (the version script defines the version nodes).
asm(".symver orion_dlsym_entry_225, dlsym@GLIBC_2.2.5");
asm(".symver orion_dlsym_entry_234, dlsym@@GLIBC_2.34");
