// The runner's side of the Orion per-thread class: which class each action asks for under
// parallel.priority, and that the scope sets it around the action and hands the thread back to
// the stream rule. The shim's side (the class applied to every launch of the thread) is tested on
// the fake driver in tests/intercept/scheduling_test.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "trainer/device/orion_thread_class.h"

namespace gpipe {
namespace {

std::vector<std::string>& calls() {
  static std::vector<std::string> log;
  return log;
}
int record_set(const char* cls) {
  calls().emplace_back(cls == nullptr ? "(null)" : cls);
  return 0;
}

TEST(OrionThreadClass, BackwardFirstMakesForwardBestEffortAndBackwardHighPriority) {
  EXPECT_STREQ(orion_thread_class(ActionType::kForward, "backward_first"), "best_effort");
  for (ActionType t : {ActionType::kBackward, ActionType::kBackwardInput, ActionType::kBackwardWeight}) {
    EXPECT_STREQ(orion_thread_class(t, "backward_first"), "high_priority") << short_name(t);
    EXPECT_STREQ(orion_thread_class(t, "forward_first"), "best_effort") << short_name(t);
    EXPECT_EQ(orion_thread_class(t, "none"), nullptr) << short_name(t);
  }
  EXPECT_STREQ(orion_thread_class(ActionType::kForward, "forward_first"), "high_priority");
  EXPECT_EQ(orion_thread_class(ActionType::kForward, "none"), nullptr);
  for (ActionType t : {ActionType::kSendForward, ActionType::kRecvForward, ActionType::kSendBackward,
                       ActionType::kRecvBackward}) {
    EXPECT_EQ(orion_thread_class(t, "backward_first"), nullptr) << short_name(t) << ": NCCL is communication";
  }
}

TEST(OrionThreadClass, ScopeSetsTheClassForItsLifetimeAndGivesTheThreadBackToTheStreamRule) {
  calls().clear();
  {
    OrionThreadClassScope forward(orion_thread_class(ActionType::kForward, "backward_first"), &record_set);
    EXPECT_EQ(calls(), std::vector<std::string>{"best_effort"});
  }
  {
    OrionThreadClassScope backward(orion_thread_class(ActionType::kBackward, "backward_first"), &record_set);
  }
  EXPECT_EQ(calls(), (std::vector<std::string>{"best_effort", "stream", "high_priority", "stream"}));
  // priority none, or no shim: nothing is called.
  calls().clear();
  { OrionThreadClassScope none(orion_thread_class(ActionType::kForward, "none"), &record_set); }
  { OrionThreadClassScope no_shim("best_effort", nullptr); }
  EXPECT_TRUE(calls().empty());
}

TEST(OrionThreadClass, WithoutThePreloadedShimTheApiIsNotFound) {
  if (std::getenv("LD_PRELOAD") != nullptr) GTEST_SKIP() << "LD_PRELOAD is set; the shim may be loaded";
  EXPECT_EQ(find_orion_set_thread_class(), nullptr);
}

}  // namespace
}  // namespace gpipe
