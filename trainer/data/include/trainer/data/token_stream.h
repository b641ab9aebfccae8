// The whole dataset's token stream, held in fixed blocks: appending never copies what is there (a
// std::vector doubling held up to 3x its tokens at a reallocation, 12 bytes per int32 token), and
// reading token i is a shift and a mask. A block's pages are touched only as tokens fill it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace gpipe {

class TokenStream {
 public:
  static constexpr int kBlockBits = 22;  // 4 Mi tokens, 16 MiB per block
  static constexpr int64_t kBlockTokens = int64_t{1} << kBlockBits;

  TokenStream() = default;
  explicit TokenStream(const std::vector<int32_t>& tokens);
  // A moved-from stream is empty (a defaulted move would leave its size over no blocks).
  TokenStream(TokenStream&& other) noexcept : blocks_(std::move(other.blocks_)), size_(std::exchange(other.size_, 0)) {
    other.blocks_.clear();
  }
  TokenStream& operator=(TokenStream&& other) noexcept {
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  void push_back(int32_t token) {
    if ((size_ & (kBlockTokens - 1)) == 0) add_block();
    blocks_.back()[size_ & (kBlockTokens - 1)] = token;
    ++size_;
  }
  int64_t size() const { return size_; }
  int32_t operator[](int64_t i) const { return blocks_[static_cast<size_t>(i >> kBlockBits)][i & (kBlockTokens - 1)]; }
  // Calls visit(tokens, count) for each block's filled part, in order (a CRC over the stream).
  template <class Visit>
  void for_each_block(Visit&& visit) const {
    for (size_t b = 0; b < blocks_.size(); ++b) {
      const int64_t begin = static_cast<int64_t>(b) * kBlockTokens;
      visit(blocks_[b].get(), static_cast<size_t>(std::min(kBlockTokens, size_ - begin)));
    }
  }
  std::vector<int32_t> to_vector() const;

 private:
  void add_block();
  std::vector<std::unique_ptr<int32_t[]>> blocks_;
  int64_t size_ = 0;
};

}  // namespace gpipe
