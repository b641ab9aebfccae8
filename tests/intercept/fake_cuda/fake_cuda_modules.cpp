// The fake driver's modules loaded from PTX text (cuModuleLoadData, cuModuleGetFunction): each
// `.entry NAME(...)` of the image becomes a function of the current context, its parameters laid
// out from their `.param [.align N] .type name[[count]]` declarations. Nothing is compiled or run:
// enough for a program that loads a kernel from PTX (driver_model_check's launch probes) to run
// against the fake as against the real driver. Text without `.version`, or a parameter the fake
// cannot size, fails CUDA_ERROR_INVALID_PTX; a module ends with its context.
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <cctype>
#include <charconv>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fake_cuda_impl {
namespace {

struct Entry {
  std::string name;
  std::vector<size_t> sizes, aligns;
};

// The bytes of a PTX scalar type (0: not one the fake knows).
size_t type_size(std::string_view type) {
  static const std::pair<std::string_view, size_t> kTypes[] = {
      {".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8}, {".u32", 4}, {".s32", 4}, {".b32", 4}, {".f32", 4},
      {".f16x2", 4}, {".bf16x2", 4}, {".u16", 2}, {".s16", 2}, {".b16", 2}, {".f16", 2}, {".bf16", 2},
      {".u8", 1}, {".s8", 1}, {".b8", 1}, {".b128", 16}};
  for (const auto& [name, size] : kTypes) {
    if (type == name) return size;
  }
  return 0;
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// One `.param [.align N] .type name[[count]]` declaration: its size and alignment; false when it
// is not one the fake can size.
bool param_layout(std::string_view decl, size_t* size, size_t* align) {
  std::istringstream words{std::string(decl)};
  const std::vector<std::string> tokens{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  if (tokens.empty() || tokens[0] != ".param") return false;
  size_t t = 1;
  size_t explicit_align = 0;
  if (t + 1 < tokens.size() && tokens[t] == ".align") {
    const std::string& n = tokens[t + 1];
    if (std::from_chars(n.data(), n.data() + n.size(), explicit_align).ec != std::errc() || explicit_align == 0) {
      return false;
    }
    t += 2;
  }
  if (t >= tokens.size()) return false;
  const size_t element = type_size(tokens[t++]);
  if (element == 0 || t >= tokens.size()) return false;
  size_t count = 1;
  const std::string& name = tokens[t];
  if (const size_t open = name.find('['); open != std::string::npos) {
    const size_t close = name.find(']', open);
    if (close == std::string::npos) return false;
    if (std::from_chars(name.data() + open + 1, name.data() + close, count).ec != std::errc() || count == 0) {
      return false;
    }
  }
  *size = element * count;
  *align = explicit_align != 0 ? explicit_align : element;
  return true;
}

// The entries of a PTX text; false when a parameter list cannot be read.
bool ptx_entries(std::string_view text, std::vector<Entry>* entries) {
  for (size_t at = text.find(".entry"); at != std::string_view::npos; at = text.find(".entry", at + 6)) {
    size_t i = at + 6;
    if (i < text.size() && !is_space(text[i])) continue;  // .entryfoo: not the directive
    while (i < text.size() && is_space(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_' || text[j] == '$')) {
      ++j;
    }
    if (j == i) return false;
    Entry e{std::string(text.substr(i, j - i)), {}, {}};
    while (j < text.size() && is_space(text[j])) ++j;
    if (j < text.size() && text[j] == '(') {  // its own parameter list, if any
      const size_t close = text.find(')', j);
      if (close == std::string_view::npos) return false;
      for (size_t from = j + 1; from < close;) {
        size_t comma = text.find(',', from);
        if (comma == std::string_view::npos || comma > close) comma = close;
        size_t size = 0, align = 0;
        if (!param_layout(text.substr(from, comma - from), &size, &align)) return false;
        e.sizes.push_back(size);
        e.aligns.push_back(align);
        from = comma + 1;
      }
    }
    entries->push_back(std::move(e));
  }
  return true;
}

}  // namespace
}  // namespace fake_cuda_impl

using namespace fake_cuda_impl;

FAKE_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::string_view text(static_cast<const char*>(image));
  std::vector<Entry> entries;
  const bool readable = text.find(".version") != std::string_view::npos && ptx_entries(text, &entries);
  uint64_t h = 0;
  uint64_t ctx = 0;
  {
    State& s = st();
    std::lock_guard lock(s.mu);
    fake_cuda_call& c = begin(s, "cuModuleLoadData");
    ctx = c.context = current_ctx();
    if (ctx == 0) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
    if (context_destroyed(ctx)) return finish(s, c, CUDA_ERROR_CONTEXT_IS_DESTROYED);
    if (!readable) return finish(s, c, CUDA_ERROR_INVALID_PTX);
    h = (s.next_handle += 0x100);
    c.value = h;
    if (CUresult rc = finish(s, c); rc != CUDA_SUCCESS) return rc;
    s.modules[h] = Module{true, ctx};  // unloaded with its context (take_context_along)
  }
  // Not atomic with the load (make_function takes the lock): no other thread knows `h` yet.
  static const size_t kNoParameters = 0;  // an empty list is a known one (sizes must not be null)
  for (const Entry& e : entries) {
    make_function(h, e.name.c_str(), e.sizes.size(), e.sizes.empty() ? &kNoParameters : e.sizes.data(), false,
                  e.aligns.empty() ? nullptr : e.aligns.data());
  }
  *module = reinterpret_cast<CUmodule>(h);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction* f, CUmodule module, const char* name) {
  if (f == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = st();
  std::lock_guard lock(s.mu);
  if (current_ctx() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  const auto m = reinterpret_cast<uint64_t>(module);
  if (auto it = s.modules.find(m); it == s.modules.end() || !it->second.loaded) return CUDA_ERROR_INVALID_HANDLE;
  for (const auto& [handle, fn] : s.functions) {
    if (fn->owner == m && !fn->is_kernel && fn->name == name) {
      *f = reinterpret_cast<CUfunction>(handle);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}
