// The fixture of the dispatcher suites (dispatcher_test.cpp, deferred_errors_test.cpp): a
// dispatcher without a background thread over a manual-clock fake device, with one stream per
// class, so every step is deterministic.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fake_device.h"
#include "scheduler/dispatcher.h"
#include "scheduler/profile_store.h"

namespace sched::dispatcher_fixture {

using testing::event_op;
using testing::FakeDevice;
using testing::kernel_op;
using testing::SubmittedOp;

constexpr StreamId kHp = 1, kBe = 2, kBe2 = 3, kComm = 4;

class DispatcherTest : public ::testing::Test {
 protected:
  std::unique_ptr<Dispatcher> make(const std::string& policy, const PolicyParams& params = {}) {
    DispatcherOptions opt;
    opt.background_thread = false;
    opt.be_max_wait_ns = 1'000'000;
    opt.profiles = &profiles;
    auto d = std::make_unique<Dispatcher>(dev, make_policy(policy, params), opt);
    d->set_stream_class(kHp, StreamClass::kHighPriority);
    d->set_stream_class(kBe, StreamClass::kBestEffort);
    d->set_stream_class(kBe2, StreamClass::kBestEffort);
    d->set_stream_class(kComm, StreamClass::kCommunication);
    return d;
  }
  std::vector<KernelId> kernels_on(StreamId stream) const {
    std::vector<KernelId> out;
    for (const auto& s : dev.submitted()) {
      if (s.stream == stream && s.kind == OpKind::kKernel) out.push_back(s.kernel);
    }
    return out;
  }
  // Position of the first submitted op matching `pred` (-1 if none).
  template <typename Pred>
  int position(Pred pred) const {
    const auto log = dev.submitted();
    for (size_t i = 0; i < log.size(); ++i) {
      if (pred(log[i])) return static_cast<int>(i);
    }
    return -1;
  }
  FakeDevice dev;
  ProfileStore profiles;
};

}  // namespace sched::dispatcher_fixture
