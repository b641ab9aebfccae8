// proc_address_check: does the driver's cuGetProcAddress answer each (name, version, per-thread
// flag) with the ABI symbol the shim hands out for it? The shim maps every function cuda.h
// declares to its ABI symbols by the PFN versions of cudaTypedefs.h (the k-th ABI of a name answers
// from its k-th PFN version; intercept/tools/gen_driver_api.py); this asks the driver itself, with
// no shim loaded, for every row of that table at its first version and compares the answer with
// dlsym of the symbol. On the fake driver (ctest) it covers what the fake answers; on a GPU
// machine (scripts/gpu/check_driver_rules.sh) the real driver: any mismatch means the shim would
// hand a wrapper of the wrong ABI to libcudart or NCCL.
//
// usage: proc_address_check [LIBRARY=libcuda.so.1]   exit 0: no mismatch, 1: mismatches, 2: setup
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_api.h"

namespace {
struct Row {
  const char* base;
  const char* symbol;
  int min_version;
  int max_version;
  bool per_thread;
};
constexpr Row kRows[] = {
#define ORION_DRIVER_FUNCTION(base, sym, lo, hi, pt, cls, hand) {#base, #sym, lo, hi, pt != 0},
#include "driver_functions.inc"
#undef ORION_DRIVER_FUNCTION
};
}  // namespace

int main(int argc, char** argv) {
  const char* library = argc > 1 ? argv[1] : "libcuda.so.1";
  if (std::getenv("LD_PRELOAD") != nullptr && std::string(std::getenv("LD_PRELOAD")).find("gpu_scheduler") != std::string::npos) {
    std::fprintf(stderr, "proc_address_check: run it without the shim in LD_PRELOAD (it asks the driver itself)\n");
    return 2;
  }
  void* driver = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    std::fprintf(stderr, "proc_address_check: cannot open %s: %s\n", library, dlerror());
    return 2;
  }
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(driver, "cuInit"));
  auto lookup = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(driver, "cuGetProcAddress_v2"));
  if (init == nullptr || lookup == nullptr) {
    std::fprintf(stderr, "proc_address_check: %s has no cuInit / cuGetProcAddress_v2\n", library);
    return 2;
  }
  init(0);
  int driver_version = 0;
  if (auto version = reinterpret_cast<CUresult (*)(int*)>(dlsym(driver, "cuDriverGetVersion"))) version(&driver_version);
  int asked = 0, equal = 0, mismatched = 0, unanswered = 0, absent = 0;
  for (const Row& r : kRows) {
    if (r.min_version <= 0 || r.min_version >= r.max_version) continue;  // answered by name only
    if (driver_version != 0 && r.min_version > driver_version) continue;  // newer than the driver
    void* expected = dlsym(driver, r.symbol);
    if (expected == nullptr) {
      ++absent;
      continue;
    }
    ++asked;
    void* got = nullptr;
    CUdriverProcAddressQueryResult status{};
    const cuuint64_t flags = r.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    if (lookup(r.base, &got, r.min_version, flags, &status) != CUDA_SUCCESS || got == nullptr) {
      ++unanswered;
      continue;
    }
    if (got == expected) {
      ++equal;
      continue;
    }
    ++mismatched;
    Dl_info info{};
    const char* name = dladdr(got, &info) != 0 && info.dli_sname != nullptr ? info.dli_sname : "(no exported name)";
    std::printf("mismatch: %s @%d%s -> %s, the shim maps it to %s\n", r.base, r.min_version,
                r.per_thread ? " per-thread" : "", name, r.symbol);
  }
  std::printf("proc_address_check: %s (driver %d): %d lookups, %d answered with the shim's ABI symbol, "
              "%d mismatched, %d not answered, %d symbols the library lacks\n",
              library, driver_version, asked, equal, mismatched, unanswered, absent);
  // Two answers the shim cannot take from a table, reported (not failures): what the shim does with
  // each is in intercept/src/proc_address.cpp.
  // (1) Per-thread semantics below the version of a name's first per-thread variant: not found, the
  //     function given without the flag (the shim hands out its legacy wrapper), or another one (the
  //     shim hands it out unwrapped and stops holding work).
  // (2) Above the shim's build (CUDA_VERSION), at the driver's own version: the function given at
  //     CUDA_VERSION (the shim's wrapper fits), or another ABI (handed out unwrapped, holding stops).
  int early_not_found = 0, early_legacy = 0, early_other = 0, newer_same = 0, newer_other = 0;
  auto ask = [&](const char* base, int version, cuuint64_t flags) -> void* {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    return lookup(base, &fn, version, flags, &status) == CUDA_SUCCESS ? fn : nullptr;
  };
  std::map<std::string, int> first_per_thread;  // base name -> the version of its first per-thread variant
  for (const Row& r : kRows) {
    if (!r.per_thread || r.min_version <= 0) continue;
    auto [it, added] = first_per_thread.emplace(r.base, r.min_version);
    if (!added) it->second = std::min(it->second, r.min_version);
  }
  {
    for (const Row& r : kRows) {
      const auto first = first_per_thread.find(r.base);
      if (r.per_thread || first == first_per_thread.end() || r.min_version <= 0 || r.min_version >= first->second) {
        continue;
      }
      void* with_flag = ask(r.base, r.min_version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
      if (with_flag == nullptr) {
        ++early_not_found;
      } else if (with_flag == ask(r.base, r.min_version, CU_GET_PROC_ADDRESS_DEFAULT)) {
        ++early_legacy;
      } else {
        ++early_other;
        std::printf("note: %s @%d per-thread is answered with a function it lacks without the flag\n", r.base,
                    r.min_version);
      }
    }
  }
  if (driver_version > CUDA_VERSION) {
    for (const Row& r : kRows) {
      if (r.min_version <= 0 || r.max_version <= driver_version || r.min_version > CUDA_VERSION) continue;
      const cuuint64_t flags = r.per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
      void* at_driver = ask(r.base, driver_version, flags);
      if (at_driver == nullptr) continue;
      if (at_driver == ask(r.base, CUDA_VERSION, flags)) {
        ++newer_same;
      } else {
        ++newer_other;
        std::printf("note: %s%s has a newer ABI at %d than at %d (this build)\n", r.base,
                    r.per_thread ? " per-thread" : "", driver_version, CUDA_VERSION);
      }
    }
  }
  std::printf("proc_address_check: per-thread below the first per-thread version: %d not found, %d the legacy "
              "function, %d another; at the driver's version %d vs the build's %d: %d unchanged, %d newer ABIs\n",
              early_not_found, early_legacy, early_other, driver_version, CUDA_VERSION, newer_same, newer_other);
  return mismatched == 0 && asked > 0 ? 0 : 1;
}
