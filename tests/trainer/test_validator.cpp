// The validator on planted errors: swapped receives, a missing backward, a duplicated forward,
// a mismatched send/recv, rendezvous deadlocks. Each must be reported with its rank and action
// index, and marked in the grid.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

int index_of(const Schedule& s, int rank, const Action& a) {
  const auto& p = s.per_rank[rank];
  const auto it = std::find(p.begin(), p.end(), a);
  EXPECT_NE(it, p.end()) << to_string(a) << " not on rank " << rank;
  return static_cast<int>(it - p.begin());
}

// The issue on (rank, index) whose message contains `text`, or nullptr.
const ValidationIssue* find_issue(const ValidationResult& r, int rank, int index, const std::string& text) {
  for (const ValidationIssue& i : r.issues)
    if (i.rank == rank && i.step == index && i.message.find(text) != std::string::npos) return &i;
  return nullptr;
}

// The grid line whose `rank`-th cell contains `cell`.
std::string grid_line_with(const std::string& grid, const std::string& cell) {
  size_t pos = grid.find(cell);
  if (pos == std::string::npos) return "";
  const size_t begin = grid.rfind('\n', pos) + 1;
  return grid.substr(begin, grid.find('\n', pos) - begin);
}

TEST(Validator, CleanScheduleHasNoIssuesAndAStepPerAction) {
  const Schedule s = with_communication(make_schedule(ScheduleKind::kOneFOneB, 2, 3));
  const ValidationResult r = validate(s);
  ASSERT_TRUE(r.ok) << render_grid(s, r);
  for (const auto& steps : r.step_of_action)
    for (int step : steps) EXPECT_GE(step, 0);
  const std::string grid = render_grid(s, r);
  EXPECT_THAT(grid, ::testing::ContainsRegex("step +\\| rank 0 +\\| rank 1\n"));
  EXPECT_THAT(grid, HasSubstr("ok: "));
  EXPECT_EQ(grid.find('!'), std::string::npos);
  EXPECT_EQ(grid.find(" <"), std::string::npos);
}

TEST(Validator, SwappedReceivesAreAMismatch) {
  Schedule s = with_communication(make_schedule(ScheduleKind::kGPipe, 2, 3));
  auto& rank1 = s.per_rank[1];
  const int first = index_of(s, 1, {ActionType::kRecvForward, 1, 0});
  const int second = index_of(s, 1, {ActionType::kRecvForward, 1, 1});
  std::swap(rank1[first], rank1[second]);
  const ValidationResult r = validate(s);
  ASSERT_FALSE(r.ok);
  // The first receive posted (now RF1) meets rank 0's first send (SF0).
  const ValidationIssue* issue = find_issue(r, 1, first, "mismatch");
  ASSERT_NE(issue, nullptr) << render_grid(s, r);
  EXPECT_THAT(issue->message, HasSubstr("0SF0 sent by rank 0 is matched by 1RF1"));
  EXPECT_NE(find_issue(r, 0, index_of(s, 0, {ActionType::kSendForward, 0, 0}), "mismatch"), nullptr);
  const std::string grid = render_grid(s, r);
  EXPECT_THAT(grid_line_with(grid, "!RF1!"), HasSubstr(" <"));
  EXPECT_THAT(grid_line_with(grid, "!SF0!"), HasSubstr(" <"));
}

TEST(Validator, MissingBackwardIsReportedAndDeadlocksItsPeer) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 4);  // compute-only
  auto& rank1 = s.per_rank[1];
  rank1.erase(rank1.begin() + index_of(s, 1, {ActionType::kBackward, 1, 2}));
  const ValidationResult r = validate(s);
  ASSERT_FALSE(r.ok);
  const auto missing = std::find_if(r.issues.begin(), r.issues.end(), [](const ValidationIssue& i) {
    return i.message.find("missing backward (B, or I + W) of stage 1 micro-batch 2") != std::string::npos;
  });
  ASSERT_NE(missing, r.issues.end());
  EXPECT_EQ(missing->rank, 1);
  const int blocked = index_of(s, 0, {ActionType::kBackward, 0, 2});
  const ValidationIssue* deadlock = find_issue(r, 0, blocked, "deadlock");
  ASSERT_NE(deadlock, nullptr) << render_grid(s, r);
  EXPECT_THAT(deadlock->message, HasSubstr("waiting for 1B2 on rank 1"));
  const std::string grid = render_grid(s, r);
  EXPECT_THAT(grid_line_with(grid, "!B2!"), HasSubstr("stuck"));
}

TEST(Validator, DuplicatedForwardIsReported) {
  Schedule s = with_communication(make_schedule(ScheduleKind::kOneFOneB, 3, 4));
  auto& rank0 = s.per_rank[0];
  const int at = index_of(s, 0, {ActionType::kForward, 0, 1});
  rank0.insert(rank0.begin() + at + 1, Action{ActionType::kForward, 0, 1});
  const ValidationResult r = validate(s);
  ASSERT_FALSE(r.ok);
  const ValidationIssue* dup = find_issue(r, 0, at + 1, "duplicate 0F1");
  ASSERT_NE(dup, nullptr) << render_grid(s, r);
  EXPECT_THAT(dup->message, HasSubstr("already at rank 0 action #" + std::to_string(at)));
  EXPECT_THAT(render_grid(s, r), HasSubstr("!F1!"));
}

TEST(Validator, MismatchedSendIsReported) {
  Schedule s = with_communication(make_schedule(ScheduleKind::kZeroBubbleH1, 2, 4));
  // Rank 1 sends the gradient of micro-batch 3 where rank 0 expects micro-batch 1's.
  const int at = index_of(s, 1, {ActionType::kSendBackward, 1, 1});
  s.per_rank[1][at].microbatch = 3;
  const ValidationResult r = validate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(find_issue(r, 1, at, "expected 0RB3"), nullptr) << render_grid(s, r);
  EXPECT_THAT(render_grid(s, r), HasSubstr("!SB3!"));
}

TEST(Validator, ReceiveAfterItsComputeIsAnOrderingError) {
  Schedule s = with_communication(make_schedule(ScheduleKind::kGPipe, 2, 2));
  auto& rank1 = s.per_rank[1];
  const int recv = index_of(s, 1, {ActionType::kRecvForward, 1, 0});
  std::swap(rank1[recv], rank1[recv + 1]);  // F0 before RF0
  const ValidationResult r = validate(s);
  EXPECT_NE(find_issue(r, 1, recv, "1F0 needs 1RF0"), nullptr) << render_grid(s, r);
}

TEST(Validator, CircularWaitIsADeadlockNamingEachBlockedRank) {
  // Rank 0 waits for the gradient before sending the activation that produces it.
  Schedule s;
  s.kind = ScheduleKind::kGPipe;
  s.num_ranks = 2;
  s.num_microbatches = 1;
  s.per_rank = {{{ActionType::kForward, 0, 0}, {ActionType::kRecvBackward, 0, 0}, {ActionType::kBackward, 0, 0},
                 {ActionType::kSendForward, 0, 0}},
                {{ActionType::kRecvForward, 1, 0}, {ActionType::kForward, 1, 0}, {ActionType::kBackward, 1, 0},
                 {ActionType::kSendBackward, 1, 0}}};
  const ValidationResult r = validate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(find_issue(r, 0, 1, "waiting for rank 1 to post 1SB0"), nullptr) << render_grid(s, r);
  EXPECT_NE(find_issue(r, 1, 0, "waiting for rank 0 to post 0SF0"), nullptr) << render_grid(s, r);
  const std::string stuck = grid_line_with(render_grid(s, r), "stuck");
  EXPECT_THAT(stuck, HasSubstr("!RB0!"));
  EXPECT_THAT(stuck, HasSubstr("!RF0!"));
}

// Lowering interleaved 1F1B naively (each receive right before its compute, each send right
// after) deadlocks with rendezvous sends: two ranks each send a gradient to the other in separate
// groups. The validator must catch this; with_communication()'s Megatron pairing must not have it.
TEST(Validator, NaiveInterleavedLoweringDeadlocksOnRendezvousSends) {
  const Schedule compute = make_schedule(ScheduleKind::kInterleavedOneFOneB, 2, 4, 2);
  Schedule naive = compute;
  for (int r = 0; r < 2; ++r) {
    std::vector<Action> prog;
    for (const Action& a : compute.per_rank[r]) {
      const bool f = a.type == ActionType::kForward;
      if (f && a.stage > 0) prog.push_back({ActionType::kRecvForward, a.stage, a.microbatch});
      if (!f && a.stage < 3) prog.push_back({ActionType::kRecvBackward, a.stage, a.microbatch});
      prog.push_back(a);
      if (f && a.stage < 3) prog.push_back({ActionType::kSendForward, a.stage, a.microbatch});
      if (!f && a.stage > 0) prog.push_back({ActionType::kSendBackward, a.stage, a.microbatch});
    }
    naive.per_rank[r] = prog;
  }
  const ValidationResult r = validate(naive);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(find_issue(r, 0, index_of(naive, 0, {ActionType::kSendBackward, 2, 0}), "waiting for rank 1 to post 1RB0"),
            nullptr)
      << render_grid(naive, r);
  EXPECT_TRUE(validate(with_communication(compute)).ok);
}

TEST(Validator, OutOfRangeAndMisplacedActions) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 2);
  s.per_rank[0].push_back({ActionType::kForward, 1, 0});  // stage 1 lives on rank 1
  ValidationResult r = validate(s);
  EXPECT_NE(find_issue(r, 0, 4, "lives on rank 1"), nullptr) << render_grid(s, r);
  s = make_schedule(ScheduleKind::kOneFOneB, 2, 2);
  s.per_rank[1].push_back({ActionType::kForward, 1, 7});
  r = validate(s);
  EXPECT_NE(find_issue(r, 1, 4, "out of range"), nullptr);
  s.per_rank.pop_back();
  EXPECT_FALSE(validate(s).ok);  // one program for two ranks
}

}  // namespace
}  // namespace gpipe
