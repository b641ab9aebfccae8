// A thread-safe recording Device for the scheduler's tests: remembers every submitted op in
// order, fails chosen kernels with a chosen code, and completes ops either when the test says so
// (manual) or at the next poll (auto). Time is a manual clock unless real_clock is set.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "scheduler/device.h"

namespace sched::testing {

// A payload carrying one value; the device reads it at submit, so a dangling borrowed payload
// shows up as a wrong value (and as a use-after-free under ASan).
struct ValuePayload final : OpPayload {
  explicit ValuePayload(int v) : value(v) {}
  int value;
};

inline std::unique_ptr<OpPayload> clone_value_payload(const OpPayload& borrowed) {
  return std::make_unique<ValuePayload>(static_cast<const ValuePayload&>(borrowed).value);
}
inline std::unique_ptr<OpPayload> refuse_clone(const OpPayload&) { return nullptr; }

struct SubmittedOp {
  uint64_t seq = 0;
  StreamId stream = 0;
  OpKind kind = OpKind::kKernel;
  StreamClass cls = StreamClass::kUnmanaged;
  KernelId kernel = 0;
  EventId event = 0;
  int payload_value = -1;  // ValuePayload::value, -1 without payload
  int64_t submitted_ns = 0;
};

class FakeDevice final : public Device {
 public:
  explicit FakeDevice(int sm_count = 100, int blocks_per_sm = 2)
      : sm_count_(sm_count), blocks_per_sm_(blocks_per_sm) {}

  // ---- test controls ----
  int occupancy_unknown_answers = 0;  // the next N occupancy questions answer kOccupancyUnknown
  bool auto_complete = false;  // set before use: ops complete at a poll once they are...
  int64_t complete_after_ns = 0;  // ...this old (device clock), in submission order
  bool real_clock = false;     // set before use: now_ns() is the steady clock
  int64_t kernel_duration_ns = 1000;  // start..end reported for completed kernels
  bool report_in_submit = false;  // report each op complete from inside submit() (as a driver
                                  // backend does for an op it cannot track)
  // Called at the start of every submit(), outside the device's lock: a test can block a submit
  // there as a driver call blocks (a pageable copy, a full launch queue).
  std::function<void(const Op&)> before_submit;
  void fail_kernel(KernelId id, int code) {
    std::lock_guard lock(mu_);
    failing_[id] = code;
  }
  void advance(int64_t ns) { clock_ns_.fetch_add(ns); }
  void complete_all() {
    std::lock_guard lock(mu_);
    for (auto& c : in_flight_) ready_.push_back(c);
    in_flight_.clear();
  }
  void complete_stream(StreamId stream) {  // every op in flight on `stream`
    std::lock_guard lock(mu_);
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if (it->stream != stream) {
        ++it;
        continue;
      }
      ready_.push_back(*it);
      it = in_flight_.erase(it);
    }
  }
  void complete_oldest() {  // the op submitted first of those in flight
    std::lock_guard lock(mu_);
    if (in_flight_.empty()) return;
    ready_.push_back(in_flight_.front());
    in_flight_.erase(in_flight_.begin());
  }
  std::vector<SubmittedOp> submitted() const {
    std::lock_guard lock(mu_);
    return log_;
  }
  size_t submitted_count() const {
    std::lock_guard lock(mu_);
    return log_.size();
  }
  size_t in_flight_count() const {
    std::lock_guard lock(mu_);
    return in_flight_.size();
  }
  int occupancy_queries() const { return occupancy_queries_.load(); }

  // ---- Device ----
  int submit(const Op& op) override {
    if (before_submit) before_submit(op);
    SubmittedOp s{op.seq, op.stream, op.kind, op.cls, op.kernel.id, op.event, -1, op.submitted_ns};
    if (const auto* p = dynamic_cast<const ValuePayload*>(op.payload())) s.payload_value = p->value;
    Completion c{op.seq, op.stream, op.kind, op.kernel.id, 0, 0};
    CompletionListener* report_to = nullptr;
    {
      std::lock_guard lock(mu_);
      if (auto it = failing_.find(op.kernel.id); op.kind == OpKind::kKernel && it != failing_.end()) {
        return it->second;
      }
      log_.push_back(s);
      c.start_ns = c.end_ns = now_locked();
      if (op.kind == OpKind::kKernel) c.end_ns += kernel_duration_ns;
      if (report_in_submit) {
        report_to = listener_;
      } else {
        in_flight_.push_back(c);
      }
    }
    if (report_to != nullptr) report_to->on_complete(c);
    return 0;
  }
  void poll() override {
    std::vector<Completion> ready;
    CompletionListener* listener = nullptr;
    {
      std::lock_guard lock(mu_);
      if (auto_complete) {
        const int64_t cutoff = now_ns() - complete_after_ns;
        size_t n = 0;
        while (n < in_flight_.size() && in_flight_[n].start_ns <= cutoff) ready_.push_back(in_flight_[n++]);
        in_flight_.erase(in_flight_.begin(), in_flight_.begin() + static_cast<ptrdiff_t>(n));
      }
      ready.swap(ready_);
      listener = listener_;
    }
    if (listener != nullptr) {
      for (const Completion& c : ready) listener->on_complete(c);
    }
  }
  void set_listener(CompletionListener* listener) override {
    std::lock_guard lock(mu_);
    listener_ = listener;
  }
  int sm_count() const override { return sm_count_; }
  int max_active_blocks_per_sm(const KernelInfo&) override {
    occupancy_queries_.fetch_add(1);
    if (occupancy_unknown_answers > 0) {
      --occupancy_unknown_answers;
      return kOccupancyUnknown;
    }
    return blocks_per_sm_;
  }
  int64_t now_ns() const override {
    if (real_clock) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    }
    return clock_ns_.load();
  }

 private:
  int64_t now_locked() const { return now_ns(); }
  const int sm_count_;
  const int blocks_per_sm_;
  mutable std::mutex mu_;
  std::vector<SubmittedOp> log_;
  std::vector<Completion> in_flight_;
  std::vector<Completion> ready_;
  std::map<KernelId, int> failing_;
  CompletionListener* listener_ = nullptr;
  std::atomic<int64_t> clock_ns_{1'000'000};
  std::atomic<int> occupancy_queries_{0};
};

// Op builders.
inline Op kernel_op(StreamId stream, KernelId id, uint32_t blocks = 1,
                    KernelProfile hint = KernelProfile::kUnknown) {
  Op op;
  op.kind = OpKind::kKernel;
  op.stream = stream;
  op.kernel.id = id;
  op.kernel.grid.x = blocks;
  op.kernel.block.x = 128;
  op.kernel.profile_hint = hint;
  return op;
}
inline Op event_op(OpKind kind, StreamId stream, EventId event) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.event = event;
  return op;
}
inline Op graph_op(StreamId stream, uint64_t exec) {
  Op op;
  op.kind = OpKind::kGraphLaunch;
  op.stream = stream;
  op.event = exec;
  return op;
}

}  // namespace sched::testing
