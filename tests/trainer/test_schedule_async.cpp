// Asynchronous pipelines as data (parallel.sync_mode: asp): with_weight_versions() annotates
// PipeDream's 1F1B-async with the weight version each F and B runs with, stashed_versions()
// counts what weight stashing holds, and the validator refuses versions that break the rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

// Rank r's F and B as "F3@v1" strings, in order.
std::vector<std::string> versions_of(const Schedule& s, int rank) {
  std::vector<std::string> out;
  for (const Action& a : s.per_rank[static_cast<size_t>(rank)]) {
    if (a.type == ActionType::kForward || a.type == ActionType::kBackward)
      out.push_back(std::string(short_name(a.type)) + std::to_string(a.microbatch) + "@v" +
                    std::to_string(a.weight_version));
  }
  return out;
}

TEST(AsyncSchedule, OneFOneBAsyncVersionsFollowPipeDream) {
  const Schedule s = with_weight_versions(make_schedule(ScheduleKind::kOneFOneB, 4, 8));
  EXPECT_EQ(s.sync_mode, SyncMode::kAsp);
  EXPECT_TRUE(s.weight_stashing);
  // Rank 0: four forwards on the initial weights, then each backward (on its forward's version)
  // is one update, and the next forward runs with it.
  EXPECT_THAT(versions_of(s, 0),
              ::testing::ElementsAre("F0@v0", "F1@v0", "F2@v0", "F3@v0", "B0@v0", "F4@v1", "B1@v0", "F5@v2",
                                     "B2@v0", "F6@v3", "B3@v0", "F7@v4", "B4@v1", "B5@v2", "B6@v3", "B7@v4"));
  // The last rank has one micro-batch in flight: every backward on the version its forward used,
  // which is also the newest.
  EXPECT_THAT(versions_of(s, 3), ::testing::ElementsAre("F0@v0", "B0@v0", "F1@v1", "B1@v1", "F2@v2", "B2@v2",
                                                        "F3@v3", "B3@v3", "F4@v4", "B4@v4", "F5@v5", "B5@v5",
                                                        "F6@v6", "B6@v6", "F7@v7", "B7@v7"));
  const ValidationResult v = validate(s);
  EXPECT_TRUE(v.ok) << render_grid(s, v);
  EXPECT_THAT(render_grid(s, v), HasSubstr("F4@v1"));
  // It still communicates as 1F1B does, versions kept.
  const Schedule lowered = with_communication(s);
  EXPECT_TRUE(validate(lowered).ok);
  EXPECT_EQ(lowered.sync_mode, SyncMode::kAsp);
  EXPECT_THAT(versions_of(lowered, 0), ::testing::ElementsAreArray(versions_of(s, 0)));
}

TEST(AsyncSchedule, StashingHoldsOneVersionPerOtherMicroBatchInFlight) {
  EXPECT_THAT(stashed_versions(with_weight_versions(make_schedule(ScheduleKind::kOneFOneB, 4, 8))),
              ::testing::ElementsAre(3, 2, 1, 0));
  EXPECT_THAT(stashed_versions(with_weight_versions(make_schedule(ScheduleKind::kOneFOneB, 4, 2))),
              ::testing::ElementsAre(1, 1, 1, 0));
  // GPipe-async: every forward runs on v0 before any update, so after the first backward's update
  // the remaining micro-batches need one stashed version (v0) on every stage.
  EXPECT_THAT(stashed_versions(with_weight_versions(make_schedule(ScheduleKind::kGPipe, 2, 4))),
              ::testing::ElementsAre(1, 1));
  EXPECT_THAT(stashed_versions(make_schedule(ScheduleKind::kOneFOneB, 4, 8)), ::testing::ElementsAre(0, 0, 0, 0))
      << "bsp stashes nothing";
}

TEST(AsyncSchedule, WithoutStashingABackwardUsesTheNewestWeights) {
  const Schedule s = with_weight_versions(make_schedule(ScheduleKind::kOneFOneB, 4, 8), /*stashing=*/false);
  EXPECT_FALSE(s.weight_stashing);
  const auto v = versions_of(s, 0);
  // B1 ran forward on v0 but its backward sees v1: the mismatch stashing exists to avoid.
  EXPECT_EQ(v[6], "B1@v1");
  EXPECT_EQ(v[1], "F1@v0");
  EXPECT_TRUE(validate(s).ok);
  EXPECT_THAT(stashed_versions(s), ::testing::ElementsAre(0, 0, 0, 0));
}

TEST(AsyncSchedule, TheValidatorRefusesVersionsThatBreakTheRule) {
  Schedule s = with_weight_versions(make_schedule(ScheduleKind::kOneFOneB, 2, 4));
  for (Action& a : s.per_rank[0]) {
    if (a.type == ActionType::kBackward && a.microbatch == 1) a.weight_version = 1;  // not its forward's v0
  }
  ValidationResult r = validate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_THAT(render_grid(s, r), HasSubstr("runs with weight version 1, expected 0 (its forward's version: weight stashing)"));
  Schedule bsp = make_schedule(ScheduleKind::kOneFOneB, 2, 4);
  bsp.per_rank[1][0].weight_version = 0;
  r = validate(bsp);
  ASSERT_FALSE(r.ok);
  EXPECT_THAT(r.issues[0].message, HasSubstr("carries a weight version but the schedule is bsp"));
}

TEST(AsyncSchedule, SplitBackwardsAndOverlappedPairsAreRefusedWithTheFix) {
  try {
    with_weight_versions(make_schedule(ScheduleKind::kZeroBubbleH1, 4, 8));
    FAIL() << "zb_h1 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("use parallel.schedule: 1f1b"));
  }
  try {
    with_weight_versions(with_overlap(make_schedule(ScheduleKind::kOneFOneB, 4, 8), OverlapMode::kOn));
    FAIL() << "overlapped pairs accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("parallel.overlap_f_b: false"));
  }
  EXPECT_EQ(parse_sync_mode("asp"), SyncMode::kAsp);
  EXPECT_EQ(parse_sync_mode("bsp"), SyncMode::kBsp);
  EXPECT_THROW(parse_sync_mode("async"), std::invalid_argument);
}

}  // namespace
}  // namespace gpipe
