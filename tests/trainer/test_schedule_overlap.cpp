// Overlapped forward+backward pairs (Action::overlaps_next, torch's OVERLAP_F_B): dualpipev's own
// pairs where torch has them, parallel.overlap_f_b's pairing of the other kinds (order kept,
// runnable on every legal shape), the lowering (receives before a pair, sends after it), the
// validator's rules for a pair, the grid and CSV forms, and the activation metric.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "trainer/schedule/schedule.h"
#include "trainer/schedule/schedule_csv.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> pairs_of(const Schedule& s, int rank) {
  std::vector<std::string> out;
  const auto& prog = s.per_rank[static_cast<size_t>(rank)];
  for (size_t k = 0; k + 1 < prog.size(); ++k)
    if (prog[k].overlaps_next) out.push_back(to_string_pair(prog[k], prog[k + 1]));
  return out;
}

Schedule without_flags(Schedule s) { return with_overlap(s, OverlapMode::kOff); }

TEST(OverlapPairs, DualPipeVPairsAreTorchsOverlapFB) {
  // torch 2.11 ScheduleDualPipeV(p=2, m=4) pipeline_order, its OVERLAP_F_B actions.
  const Schedule s = make_schedule(ScheduleKind::kDualPipeV, 2, 4, 2);
  EXPECT_EQ(pairs_of(s, 0), (std::vector<std::string>{"(0F3;3B1)", "(3F2;0B0)", "(3F3;0B1)"}));
  // The last rank's first steady-state F0 and B1 are not a pair (torch: a shorter bubble).
  EXPECT_EQ(pairs_of(s, 1), (std::vector<std::string>{"(2F2;1B0)", "(1F3;2B1)", "(2F3;1B1)"}));
  const auto& last = s.per_rank[1];
  const auto first_b = std::find_if(last.begin(), last.end(), [](const Action& a) { return a.type == ActionType::kBackward; });
  ASSERT_NE(first_b, last.end());
  EXPECT_EQ(to_string(*first_b), "2B0");
  EXPECT_FALSE((first_b - 1)->overlaps_next) << "1F2 before 2B0 runs alone";
  EXPECT_EQ(count_overlapped_pairs(s), 6);
  EXPECT_TRUE(validate(with_communication(s)).ok);
}

TEST(OverlapPairs, ModeFalseRemovesThePairsAndKeepsTheOrder) {
  const Schedule paired = make_schedule(ScheduleKind::kDualPipeV, 3, 8, 2);
  const Schedule plain = with_overlap(paired, OverlapMode::kOff);
  EXPECT_EQ(count_overlapped_pairs(plain), 0);
  ASSERT_EQ(plain.per_rank.size(), paired.per_rank.size());
  for (size_t r = 0; r < paired.per_rank.size(); ++r) {
    ASSERT_EQ(plain.per_rank[r].size(), paired.per_rank[r].size());
    for (size_t k = 0; k < paired.per_rank[r].size(); ++k) {
      EXPECT_EQ(plain.per_rank[r][k].type, paired.per_rank[r][k].type);
      EXPECT_EQ(plain.per_rank[r][k].microbatch, paired.per_rank[r][k].microbatch);
    }
  }
  EXPECT_TRUE(validate(with_communication(plain)).ok);
  EXPECT_EQ(with_overlap(paired, OverlapMode::kAuto).per_rank, paired.per_rank);
}

TEST(OverlapPairs, ModeTruePairsOneFOneBsSteadyStateButNotTheLastRank) {
  const Schedule s = with_overlap(make_schedule(ScheduleKind::kOneFOneB, 4, 8), OverlapMode::kOn);
  // Rank 2 (warm-up 1): F0 F1 B0 F2 B1 ...: each steady forward with the backward after it.
  EXPECT_EQ(pairs_of(s, 2), (std::vector<std::string>{"(2F1;2B0)", "(2F2;2B1)", "(2F3;2B2)", "(2F4;2B3)",
                                                     "(2F5;2B4)", "(2F6;2B5)", "(2F7;2B6)"}));
  // The last rank's forward is followed by its own backward: never a pair.
  EXPECT_TRUE(pairs_of(s, 3).empty());
  EXPECT_EQ(pairs_of(s, 0).size(), 5u);  // warm-up 3 forwards, then 5 pairs
  EXPECT_EQ(without_flags(s).per_rank, make_schedule(ScheduleKind::kOneFOneB, 4, 8).per_rank) << "pairing keeps every rank's order";
  const Schedule lowered = with_communication(s);
  const ValidationResult result = validate(lowered);
  ASSERT_TRUE(result.ok) << render_grid(lowered, result);
  // Both receives before the pair, both sends after it: rank 1 around (1F3;1B1).
  const auto& prog = lowered.per_rank[1];
  for (size_t k = 0; k + 1 < prog.size(); ++k) {
    if (!(prog[k].overlaps_next && to_string_pair(prog[k], prog[k + 1]) == "(1F3;1B1)")) continue;
    ASSERT_GE(k, 2u);
    EXPECT_EQ(to_string(prog[k - 2]), "1RF3");
    EXPECT_EQ(to_string(prog[k - 1]), "1RB1");
    ASSERT_LT(k + 3, prog.size());
    EXPECT_EQ(to_string(prog[k + 2]), "1SF3");
    EXPECT_EQ(to_string(prog[k + 3]), "1SB1");
    return;
  }
  FAIL() << "no (1F3;1B1) pair on rank 1";
}

TEST(OverlapPairs, ModeTrueRunsOnEveryLegalShapeOfEveryKind) {
  const ScheduleKind kinds[] = {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1,
                                ScheduleKind::kInterleavedOneFOneB, ScheduleKind::kLoopedBFS,
                                ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kZeroBubbleV,
                                ScheduleKind::kDualPipeV};
  int shapes = 0, paired_shapes = 0;
  for (ScheduleKind kind : kinds) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 12; ++m) {
        for (int v = 1; v <= 3; ++v) {
          Schedule compute;
          try {
            compute = make_schedule(kind, p, m, v);
          } catch (const std::invalid_argument&) {
            continue;  // not a legal shape
          }
          const Schedule paired = with_overlap(compute, OverlapMode::kOn);
          const std::string what = std::string(to_string(kind)) + " p=" + std::to_string(p) + " m=" +
                                   std::to_string(m) + " v=" + std::to_string(v);
          EXPECT_EQ(without_flags(paired).per_rank, without_flags(compute).per_rank) << what;
          EXPECT_GE(count_overlapped_pairs(paired), count_overlapped_pairs(compute)) << what;
          const ValidationResult compute_ok = validate(paired);
          ASSERT_TRUE(compute_ok.ok) << what << "\n" << render_grid(paired, compute_ok);
          const Schedule lowered = with_communication(paired);
          const ValidationResult result = validate(lowered);
          ASSERT_TRUE(result.ok) << what << "\n" << render_grid(lowered, result);
          ++shapes;
          paired_shapes += count_overlapped_pairs(paired) > 0;
        }
      }
    }
  }
  EXPECT_GT(shapes, 400);
  EXPECT_GT(paired_shapes, shapes / 2) << "most shapes have a steady state to pair";
}

TEST(OverlapPairs, PairsThatCouldNeverStartAreSplit) {
  // Interleaved 1F1B with m = p: rank 0's last warm-up forward feeds, around the ranks, the very
  // backward the greedy rule would pair it with; that pair could never start.
  const Schedule s = with_overlap(make_schedule(ScheduleKind::kInterleavedOneFOneB, 4, 4, 2), OverlapMode::kOn);
  EXPECT_TRUE(validate(s).ok) << render_grid(s, validate(s));
  EXPECT_GT(count_overlapped_pairs(s), 0);
}

TEST(OverlapPairs, ModeTrueRefusesAScheduleThatAlreadyCommunicates) {
  const Schedule lowered = with_communication(make_schedule(ScheduleKind::kOneFOneB, 2, 4));
  try {
    (void)with_overlap(lowered, OverlapMode::kOn);
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("pairs a compute-only schedule"));
  }
}

TEST(OverlapPairs, ParseModeNamesTheValues) {
  EXPECT_EQ(parse_overlap_mode("auto"), OverlapMode::kAuto);
  EXPECT_EQ(parse_overlap_mode("true"), OverlapMode::kOn);
  EXPECT_EQ(parse_overlap_mode("false"), OverlapMode::kOff);
  try {
    (void)parse_overlap_mode("yes");
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("auto"));
    EXPECT_THAT(e.what(), HasSubstr("'yes'"));
  }
}

// A 1-rank, 1-stage, 2-micro-batch compute-only schedule with the given program.
Schedule one_rank(std::vector<Action> program) {
  Schedule s;
  s.kind = ScheduleKind::kFromFile;
  s.num_ranks = 1;
  s.num_microbatches = 2;
  s.per_rank = {std::move(program)};
  return s;
}

std::string issues_of(const Schedule& s) {
  std::string all;
  for (const ValidationIssue& i : validate(s).issues) all += i.message + "\n";
  return all;
}

TEST(OverlapPairs, ValidatorRefusesMalformedPairs) {
  using T = ActionType;
  // Valid: (F1;B0) on one stage.
  Schedule ok = one_rank({{T::kForward, 0, 0}, {T::kForward, 0, 1, true}, {T::kBackward, 0, 0}, {T::kBackward, 0, 1}});
  EXPECT_TRUE(validate(ok).ok) << issues_of(ok);
  // A micro-batch's backward beside its own forward.
  Schedule same = one_rank({{T::kForward, 0, 0}, {T::kForward, 0, 1, true}, {T::kBackward, 0, 1}, {T::kBackward, 0, 0}});
  EXPECT_THAT(issues_of(same), HasSubstr("at the same time as its own forward"));
  // Two forwards.
  Schedule two_f = one_rank({{T::kForward, 0, 0, true}, {T::kForward, 0, 1}, {T::kBackward, 0, 0}, {T::kBackward, 0, 1}});
  EXPECT_THAT(issues_of(two_f), HasSubstr("must be one forward (F) and one backward (B or I)"));
  // The rank's last action cannot start a pair.
  Schedule last = one_rank({{T::kForward, 0, 0}, {T::kForward, 0, 1}, {T::kBackward, 0, 0}, {T::kBackward, 0, 1, true}});
  EXPECT_THAT(issues_of(last), HasSubstr("is the rank's last action"));
  // A chain of three.
  Schedule chain = one_rank({{T::kForward, 0, 0}, {T::kForward, 0, 1, true}, {T::kBackward, 0, 0, true}, {T::kBackward, 0, 1}});
  EXPECT_THAT(issues_of(chain), HasSubstr("a pair has two actions"));
}

TEST(OverlapPairs, GridShowsAPairAsOneCellInOneStep) {
  const Schedule s = with_overlap(make_schedule(ScheduleKind::kOneFOneB, 2, 3), OverlapMode::kOn);
  const std::string grid = render_grid(s, validate(s));
  EXPECT_THAT(grid, HasSubstr("(F1;B0)"));
  EXPECT_THAT(grid, HasSubstr("(F2;B1)"));
  EXPECT_THAT(grid, HasSubstr("ok: "));
}

TEST(OverlapPairs, CsvKeepsPairsBothWays) {
  const Schedule s = make_schedule(ScheduleKind::kDualPipeV, 2, 4, 2);
  for (ScheduleCsvFormat format : {ScheduleCsvFormat::kComputeOnly, ScheduleCsvFormat::kComputeComms}) {
    const std::string csv = schedule_to_csv(format == ScheduleCsvFormat::kComputeOnly ? s : with_communication(s), format);
    EXPECT_THAT(csv, HasSubstr("(0F3;3B1)OVERLAP_F_B"));
    const Schedule back = schedule_from_csv(csv, "dualpipev.csv");
    EXPECT_EQ(count_overlapped_pairs(back), count_overlapped_pairs(s));
    for (int r = 0; r < 2; ++r) EXPECT_EQ(pairs_of(back, r), pairs_of(s, r));
  }
}

TEST(OverlapPairs, CsvRefusesAnOverlapThatIsNotAPair) {
  try {
    (void)schedule_from_csv("0F0,(0F1;0B0;0W0)OVERLAP_F_B,0B1\n", "three.csv");
    FAIL() << "expected ScheduleCsvError";
  } catch (const ScheduleCsvError& e) {
    EXPECT_THAT(e.what(), HasSubstr("3 sub-action(s)"));
    EXPECT_THAT(e.what(), HasSubstr("three.csv"));
  }
  try {
    (void)schedule_from_csv("0F0,(0B0;0F1)OVERLAP_F_B,0B1\n", "fine.csv");
  } catch (const ScheduleCsvError& e) {
    FAIL() << "a backward-first pair is still a pair: " << e.what();
  }
  try {
    (void)schedule_from_csv("(0F0;0F1)OVERLAP_F_B,0B0,0B1\n", "two_f.csv");
    FAIL() << "expected ScheduleCsvError";
  } catch (const ScheduleCsvError& e) {
    EXPECT_THAT(e.what(), HasSubstr("one forward (F) and one backward"));
  }
}

TEST(OverlapPairs, PeakActivationsCountBothHalvesOfAPair) {
  using T = ActionType;
  // Written backward first, the pair still holds F1's activation before B0 frees F0's.
  Schedule s = one_rank({{T::kForward, 0, 0}, {T::kBackward, 0, 0, true}, {T::kForward, 0, 1}, {T::kBackward, 0, 1}});
  EXPECT_EQ(peak_activations(s), std::vector<int>{2});
  s.per_rank[0][1].overlaps_next = false;
  EXPECT_EQ(peak_activations(s), std::vector<int>{1});
}

}  // namespace
}  // namespace gpipe
