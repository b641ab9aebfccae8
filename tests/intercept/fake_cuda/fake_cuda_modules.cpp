// The fake driver's modules loaded from PTX text (cuModuleLoadData, cuModuleGetFunction): each
// `.entry NAME(...)` of the image becomes a function of the current context, its parameters sized
// from their `.param` types (.u64 8 bytes, .u32 4, ..., .b8 name[N] N). Nothing is compiled or run:
// enough for a program that loads a kernel from PTX (driver_model_check's launch probes) to run
// against the fake as against the real driver. Other images fail CUDA_ERROR_INVALID_IMAGE.
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <cctype>
#include <cstring>
#include <string>
#include <vector>

namespace fake_cuda_impl {
namespace {

struct Entry {
  std::string name;
  std::vector<size_t> sizes;
};

size_t param_size(const std::string& decl) {
  if (auto open = decl.find('['); open != std::string::npos) return std::stoul(decl.substr(open + 1));
  for (const auto& [type, size] : {std::pair{".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8}, {".u32", 4},
                                   {".s32", 4}, {".b32", 4}, {".f32", 4}, {".u16", 2}, {".s16", 2},
                                   {".b16", 2}, {".u8", 1}, {".s8", 1}, {".b8", 1}}) {
    if (decl.find(type) != std::string::npos) return static_cast<size_t>(size);
  }
  return 0;
}

// The entries of a PTX text, or none when it is not one.
std::vector<Entry> ptx_entries(const std::string& text) {
  std::vector<Entry> entries;
  for (size_t at = text.find(".entry"); at != std::string::npos; at = text.find(".entry", at + 6)) {
    size_t i = at + 6;
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_' || text[j] == '$')) ++j;
    if (j == i) continue;
    Entry e{text.substr(i, j - i), {}};
    const size_t open = text.find('(', j), close = text.find(')', j);
    if (open != std::string::npos && close != std::string::npos && open < close) {
      size_t from = open + 1;
      while (from < close) {
        size_t comma = text.find(',', from);
        if (comma == std::string::npos || comma > close) comma = close;
        const std::string decl = text.substr(from, comma - from);
        if (decl.find(".param") != std::string::npos) e.sizes.push_back(param_size(decl));
        from = comma + 1;
      }
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

}  // namespace
}  // namespace fake_cuda_impl

using namespace fake_cuda_impl;

FAKE_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::vector<Entry> entries = ptx_entries(static_cast<const char*>(image));
  uint64_t h = 0;
  {
    State& s = st();
    std::lock_guard lock(s.mu);
    fake_cuda_call& c = begin(s, "cuModuleLoadData");
    c.context = current_ctx();
    if (c.context == 0) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
    if (context_destroyed(c.context)) return finish(s, c, CUDA_ERROR_CONTEXT_IS_DESTROYED);
    if (entries.empty() || std::strstr(static_cast<const char*>(image), ".version") == nullptr) {
      return finish(s, c, CUDA_ERROR_INVALID_IMAGE);
    }
    h = (s.next_handle += 0x100);
    s.modules[h] = true;
    c.value = h;
    if (CUresult rc = finish(s, c); rc != CUDA_SUCCESS) return rc;
  }
  for (const Entry& e : entries) make_function(h, e.name.c_str(), e.sizes.size(), e.sizes.data(), false);
  *module = reinterpret_cast<CUmodule>(h);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction* f, CUmodule module, const char* name) {
  if (f == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = st();
  std::lock_guard lock(s.mu);
  const auto m = reinterpret_cast<uint64_t>(module);
  if (auto it = s.modules.find(m); it == s.modules.end() || !it->second) return CUDA_ERROR_INVALID_HANDLE;
  for (const auto& [handle, fn] : s.functions) {
    if (fn->owner == m && !fn->is_kernel && fn->name == name) {
      *f = reinterpret_cast<CUfunction>(handle);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}
