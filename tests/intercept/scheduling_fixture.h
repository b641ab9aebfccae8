// The fixture shared by the scheduling suites: a high-priority, a best-effort and a plain
// stream, three kernels of the fake driver, and helpers to hold HP work in flight (so the shim
// defers best-effort work when scheduling) and to check that a launch was deferred.
#pragma once

#include "test_support.h"

namespace icpt_test {

class Scheduling : public ShimTest {
 protected:
  void SetUp() override {
    ShimTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(cuStreamCreateWithPriority(&hp_, 0, -5), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreateWithPriority(&be_, 0, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreate(&plain_, 0), CUDA_SUCCESS);
    const size_t sizes[] = {sizeof(int), sizeof(double)};
    k_hp_ = fake_cuda_make_function("hp_kernel", 2, sizes);
    k_be_ = fake_cuda_make_function("be_kernel", 2, sizes);
    k_other_ = fake_cuda_make_function("other_kernel", 2, sizes);
  }
  void TearDown() override {
    fake_cuda_reset();
    EXPECT_EQ(cuStreamDestroy(hp_), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamDestroy(be_), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamDestroy(plain_), CUDA_SUCCESS);
    ShimTest::TearDown();
  }

  static CUresult launch(CUfunction f, CUstream s, int a, double b = 0.5) {
    void* params[] = {&a, &b};
    return cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, s, params, nullptr);
  }

  // HP work that stays in flight: its stream is held busy in the fake driver.
  void hold_high_priority() {
    fake_cuda_set_stream_busy(hp_, 1);
    ASSERT_EQ(launch(k_hp_, hp_, 1), CUDA_SUCCESS);
  }

  // Ends hold_high_priority() once a caller waits for its op (the shim counted a caller wait), or
  // after 10 s; at once in pass-through mode, where no call waits. A fixed sleep raced a caller
  // that started late: the hold ended first, its op went inline, and no wait was counted. Joined
  // by join() or, after a failed ASSERT's early return, by its destructor (a joinable std::thread
  // going out of scope would abort the whole test program).
  class Releaser {
   public:
    Releaser() = default;
    explicit Releaser(std::thread t) : thread_(std::move(t)) {}
    Releaser(Releaser&&) = default;
    Releaser& operator=(Releaser&& other) {
      join();
      thread_ = std::move(other.thread_);
      return *this;
    }
    ~Releaser() { join(); }
    void join() {
      if (thread_.joinable()) thread_.join();
    }

   private:
    std::thread thread_;
  };
  Releaser release_high_priority_once_a_caller_waits() {
    if (!scheduled_) {
      fake_cuda_set_stream_busy(hp_, 0);
      return Releaser();
    }
    const uint64_t before = stats().caller_waits;
    return Releaser(std::thread([this, before] {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (stats().caller_waits == before && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      fake_cuda_set_stream_busy(hp_, 0);
    }));
  }

  // Scheduling is (still) on: a best-effort launch behind high priority is deferred (at once in
  // pass-through mode), and runs once high priority is done.
  void expect_best_effort_deferred_then_run() {
    hold_high_priority();
    ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
    expect_deferred(k_be_);
    fake_cuda_set_stream_busy(hp_, 0);
    EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  }

  // A launch on the best-effort stream while HP is in flight: deferred when scheduling.
  void expect_deferred(CUfunction f) {
    auto log = calls();
    if (scheduled_) {
      EXPECT_EQ(count_launches(log, f), 0u) << "best-effort launch was not deferred";
    } else {
      EXPECT_EQ(count_launches(log, f), 1u) << "pass-through must call the driver at once";
    }
  }

  CUstream hp_ = nullptr, be_ = nullptr, plain_ = nullptr;
  CUfunction k_hp_ = nullptr, k_be_ = nullptr, k_other_ = nullptr;
};

}  // namespace icpt_test
