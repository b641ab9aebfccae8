// A FIFO over a power-of-two circular buffer. Unlike std::deque it allocates only when it grows
// past its largest size so far, so the dispatcher's per-op bookkeeping allocates nothing in steady
// state. Not thread-safe (the owner's lock guards it).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace sched::detail {

template <typename T>
class FifoRing {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
  T& back() { return buf_[(head_ + size_ - 1) & (buf_.size() - 1)]; }
  T& operator[](size_t i) { return buf_[(head_ + i) & (buf_.size() - 1)]; }  // i-th from the front

  void push_back(T value) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(value);
    ++size_;
  }
  void pop_front() {
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }
  void pop_back() { --size_; }

 private:
  void grow() {
    std::vector<T> next(buf_.empty() ? 16 : buf_.size() * 2);
    for (size_t i = 0; i < size_; ++i) next[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_ = std::move(next);
    head_ = 0;
  }
  std::vector<T> buf_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace sched::detail
