// TokenStream: blocks allocated uninitialised (new int32_t[n], not make_unique's zeroing), so a
// small stream costs the pages it fills, not 16 MiB.
#include "trainer/data/token_stream.h"

namespace gpipe {

TokenStream::TokenStream(const std::vector<int32_t>& tokens) {
  for (int32_t t : tokens) push_back(t);
}

void TokenStream::add_block() {
  std::unique_ptr<int32_t[]> block(new int32_t[kBlockTokens]);  // owned before the vector may throw
  blocks_.push_back(std::move(block));
}

std::vector<int32_t> TokenStream::to_vector() const {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(size_));
  for_each_block([&out](const int32_t* tokens, size_t count) { out.insert(out.end(), tokens, tokens + count); });
  return out;
}

}  // namespace gpipe
