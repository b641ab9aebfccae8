// Schedules in torch.distributed.pipelining's CSV format (schedule_csv.h): round trips of every
// generated schedule, files torch 2.11 wrote (pasted below), placements other than stage % ranks,
// the lowering of compute-only files, and errors that name the file, row, column and cell.
// tests/trainer/torch_schedule_csv_test.py checks the same files against torch itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <unistd.h>

#include "trainer/config/config.h"
#include "trainer/schedule/schedule.h"
#include "trainer/schedule/schedule_csv.h"

namespace gpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Files torch 2.11 wrote with _dump_csv (csv.writer: "\r\n" line ends) for 2 ranks, 4 micro-batches.
// ScheduleInterleaved1F1B, 2 stages per rank (0, 2 on rank 0; 1, 3 on rank 1), compute_only:
const char* kTorchInterleavedComputeOnly =
    "0F0,0F1,2F0,2F1,,,0F2,2B0,0F3,2B1,2F2,0B0,2F3,0B1,,2B2,,2B3,,0B2,,0B3\r\n"
    ",1F0,1F1,,3F0,3B0,3F1,3B1,1F2,1B0,1F3,1B1,3F2,3B2,3F3,3B3,,1B2,,1B3\r\n";
// ...and its compute_comms dump (torch's lowering, with FSDP's UNSHARD/RESHARD and REDUCE_GRAD):
const char* kTorchInterleavedComms =
    "0UNSHARD,2UNSHARD,0F0,0SEND_F0,2RECV_F0,0F1,0SEND_F1,2RECV_F1,2F0,2SEND_F0,2F1,2SEND_F1,2RECV_B0,0F2,0SEND_F2,"
    "2B0,2SEND_B0,2RECV_B1,0F3,0SEND_F3,2RECV_F2,2B1,2SEND_B1,0RECV_B0,2F2,2SEND_F2,2RECV_F3,0B0,0RECV_B1,2F3,"
    "2SEND_F3,0B1,2RECV_B2,2B2,2SEND_B2,2RECV_B3,2B3,2SEND_B3,2REDUCE_GRAD,2RESHARD,0RECV_B2,0B2,0RECV_B3,0B3,"
    "0REDUCE_GRAD,0RESHARD\r\n"
    "1UNSHARD,3UNSHARD,1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,3RECV_F0,3F0,3RECV_F1,3B0,3SEND_B0,1RECV_F2,3F1,"
    "1RECV_B0,3B1,3SEND_B1,1RECV_F3,1F2,1SEND_F2,1RECV_B1,1B0,1SEND_B0,3RECV_F2,1F3,1SEND_F3,1B1,1SEND_B1,3RECV_F3,"
    "3F2,3B2,3SEND_B2,1RECV_B2,3F3,3B3,3SEND_B3,1RECV_B3,3REDUCE_GRAD,3RESHARD,1B2,1SEND_B2,1B3,1SEND_B3,"
    "1REDUCE_GRAD,1RESHARD\r\n";
// ScheduleZBVZeroBubble: V-shaped placement (0 and 3 on rank 0, 1 and 2 on rank 1), I/W split, compute_comms.
const char* kTorchZbvComms =
    "0UNSHARD,3UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,0F2,0SEND_F2,3F0,3RECV_F1,3I0,3SEND_B0,3W0,3F1,3I1,"
    "3SEND_B1,0RECV_B0,3W1,0F3,0SEND_F3,3RECV_F2,0I0,0W0,3F2,3I2,3SEND_B2,0RECV_B1,3W2,0I1,3RECV_F3,0W1,3F3,3I3,"
    "3SEND_B3,0RECV_B2,3W3,3REDUCE_GRAD,0RECV_B3,3RESHARD,0I2,0W2,0I3,0W3,0REDUCE_GRAD,0RESHARD\r\n"
    "1UNSHARD,2UNSHARD,1RECV_F0,1F0,1RECV_F1,2F0,2SEND_F0,1RECV_F2,1F1,2F1,2SEND_F1,2RECV_B0,2I0,2W0,1F2,2RECV_B1,"
    "1I0,1SEND_B0,1W0,1RECV_F3,2F2,2SEND_F2,2I1,2W1,1F3,2RECV_B2,1I1,1SEND_B1,1W1,2F3,2SEND_F3,2I2,2W2,2RECV_B3,"
    "1I2,1SEND_B2,2I3,1I3,1SEND_B3,1W2,2W3,2REDUCE_GRAD,2RESHARD,1W3,1REDUCE_GRAD,1RESHARD\r\n";
// ScheduleDualPipeV compute_only: OVERLAP_F_B actions whose halves are stages of the V.
const char* kTorchDualPipeVComputeOnly =
    "0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,(3F3;0B1)OVERLAP_F_B,3B3,0I2,0W2,"
    "0I3,0W3\r\n"
    "1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,(2F3;1B1)OVERLAP_F_B,2B2,1B2,2I3,1I3,2W3,"
    "1W3\r\n";

// A rank's program as torch names, space-separated.
std::string names(const std::vector<Action>& program) {
  std::string s;
  for (const Action& a : program) s += (s.empty() ? "" : " ") + torch_action_name(a);
  return s;
}

std::vector<int> placement(const Schedule& s) {
  std::vector<int> ranks;
  for (int stage = 0; stage < s.num_stages(); ++stage) ranks.push_back(s.rank_of_stage(stage));
  return ranks;
}

void expect_same_schedule(const Schedule& read, const Schedule& written, const std::string& what) {
  EXPECT_EQ(read.kind, ScheduleKind::kFromFile) << what;
  EXPECT_EQ(read.num_ranks, written.num_ranks) << what;
  EXPECT_EQ(read.stages_per_rank, written.stages_per_rank) << what;
  EXPECT_EQ(read.num_microbatches, written.num_microbatches) << what;
  EXPECT_EQ(placement(read), placement(written)) << what;
  ASSERT_EQ(read.per_rank.size(), written.per_rank.size()) << what;
  for (size_t r = 0; r < read.per_rank.size(); ++r)
    EXPECT_EQ(names(read.per_rank[r]), names(written.per_rank[r])) << what << " rank " << r;
}

// Every generated shape: each kind over ranks 1..6 and micro-batches 1..12 (interleaved: 2 and 3
// chunks, micro-batches a multiple of the ranks).
void for_each_generated(const std::function<void(const Schedule&, const std::string&)>& check) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleavedOneFOneB,
                            ScheduleKind::kZeroBubbleH1}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 12; ++m) {
        for (int v : kind == ScheduleKind::kInterleavedOneFOneB ? std::vector<int>{2, 3} : std::vector<int>{1}) {
          if (kind == ScheduleKind::kInterleavedOneFOneB && m % p != 0) continue;
          check(make_schedule(kind, p, m, v), std::string(to_string(kind)) + " p=" + std::to_string(p) +
                                                  " m=" + std::to_string(m) + " v=" + std::to_string(v));
        }
      }
    }
  }
}

// Runs f expecting a ScheduleCsvError; returns its message.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ScheduleCsvError& e) {
    return e.what();
  }
  return "(no error)";
}
std::string read_error(const std::string& text) {
  return error_of([&] { schedule_from_csv(text, "bad.csv"); });
}

class TempFile {
 public:
  explicit TempFile(const std::string& text, const std::string& tag = "s") {
    path_ = (std::filesystem::temp_directory_path() /
             ("ourgpipe_schedule_csv_" + tag + "_" + std::to_string(::getpid()) + ".csv"))
                .string();
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ScheduleCsv, ComputeOnlyRoundTripOfEveryGeneratedSchedule) {
  for_each_generated([](const Schedule& compute, const std::string& what) {
    const std::string csv = schedule_to_csv(compute, ScheduleCsvFormat::kComputeOnly);
    EXPECT_EQ(csv.find("SEND"), std::string::npos) << what;
    expect_same_schedule(schedule_from_csv(csv, what), compute, what);
  });
}

TEST(ScheduleCsv, WithCommunicationRoundTripOfEveryGeneratedSchedule) {
  for_each_generated([](const Schedule& compute, const std::string& what) {
    const Schedule full = with_communication(compute);
    const std::string csv = schedule_to_csv(full, ScheduleCsvFormat::kComputeComms);
    EXPECT_EQ(csv.find(",,"), std::string::npos) << what << ": compute_comms has no empty cells";
    expect_same_schedule(schedule_from_csv(csv, what), full, what);
    // Asking for compute_comms of the compute-only schedule lowers it first: the same text.
    EXPECT_EQ(schedule_to_csv(compute, ScheduleCsvFormat::kComputeComms), csv) << what;
  });
}

TEST(ScheduleCsv, ComputeOnlyFilesOfEveryGeneratedScheduleLowerToAValidSchedule) {
  // What the runner does with a compute-only file: torch's lowering, then validate().
  for_each_generated([](const Schedule& compute, const std::string& what) {
    const Schedule read = schedule_from_csv(schedule_to_csv(compute, ScheduleCsvFormat::kComputeOnly), what);
    const Schedule lowered = with_communication(read);
    const ValidationResult result = validate(lowered);
    EXPECT_TRUE(result.ok) << what << "\n" << render_grid(lowered, result);
  });
}

TEST(ScheduleCsv, ComputeOnlyCellsAreDryRunSteps) {
  // 1F1B, 2 ranks, 2 micro-batches: rank 1 waits a step for 0F0, rank 0 for each gradient.
  const std::string csv = schedule_to_csv(make_schedule(ScheduleKind::kOneFOneB, 2, 2), ScheduleCsvFormat::kComputeOnly);
  EXPECT_EQ(csv, "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1\n");
  EXPECT_EQ(schedule_to_csv(with_communication(make_schedule(ScheduleKind::kOneFOneB, 2, 2)),
                            ScheduleCsvFormat::kComputeComms),
            "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
            "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
}

TEST(ScheduleCsv, WriterPutsAGroupsSendsBeforeItsReceives) {
  Schedule s = with_communication(make_schedule(ScheduleKind::kOneFOneB, 3, 4));
  // Rank 1 posts groups holding both; turn each around (receives first): the same schedule here.
  int turned = 0;
  for (size_t k = 0; k < s.per_rank[1].size();) {
    size_t end = k;
    while (end < s.per_rank[1].size() && is_communication(s.per_rank[1][end].type)) ++end;
    if (end - k >= 2) {
      std::reverse(s.per_rank[1].begin() + static_cast<long>(k), s.per_rank[1].begin() + static_cast<long>(end));
      ++turned;
    }
    k = std::max(end, k + 1);
  }
  ASSERT_GT(turned, 0);
  ASSERT_TRUE(validate(s).ok);
  const Schedule back = schedule_from_csv(schedule_to_csv(s, ScheduleCsvFormat::kComputeComms), "turned");
  const auto& prog = back.per_rank[1];
  for (size_t k = 1; k < prog.size(); ++k) {
    const bool recv_then_send =
        (prog[k - 1].type == ActionType::kRecvForward || prog[k - 1].type == ActionType::kRecvBackward) &&
        (prog[k].type == ActionType::kSendForward || prog[k].type == ActionType::kSendBackward);
    EXPECT_FALSE(recv_then_send) << "rank 1 action #" << k << ": " << names(prog);
  }
  // The generator already writes sends first, so its round trip is the identity (above); here
  // the order within each group is restored to the generator's.
  expect_same_schedule(back, with_communication(make_schedule(ScheduleKind::kOneFOneB, 3, 4)), "turned");
}

TEST(ScheduleCsv, ReadsTorchsInterleavedFiles) {
  const Schedule compute = schedule_from_csv(kTorchInterleavedComputeOnly, "torch_interleaved.csv");
  EXPECT_EQ(compute.num_ranks, 2);
  EXPECT_EQ(compute.stages_per_rank, 2);
  EXPECT_EQ(compute.num_microbatches, 4);
  EXPECT_EQ(placement(compute), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(names(compute.per_rank[0]), "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");

  // Torch's dump with communication, UNSHARD/RESHARD/REDUCE_GRAD dropped, validates here too;
  // and lowering the compute-only file gives exactly torch's order (its _add_send_recv).
  const Schedule comms = schedule_from_csv(kTorchInterleavedComms, "torch_interleaved_comms.csv");
  EXPECT_EQ(comms.num_microbatches, 4);
  EXPECT_EQ(placement(comms), (std::vector<int>{0, 1, 0, 1}));
  for (const auto& prog : comms.per_rank) EXPECT_EQ(names(prog).find("UNSHARD"), std::string::npos);
  const Schedule lowered = with_communication(compute);
  for (size_t r = 0; r < 2; ++r) EXPECT_EQ(names(lowered.per_rank[r]), names(comms.per_rank[r])) << "rank " << r;
  EXPECT_TRUE(validate(lowered).ok);
}

TEST(ScheduleCsv, ReadsAVShapedPlacementFromTheFile) {
  const Schedule s = schedule_from_csv(kTorchZbvComms, "torch_zbv.csv");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.stages_per_rank, 2);
  EXPECT_EQ(placement(s), (std::vector<int>{0, 1, 1, 0}));  // not stage % ranks
  EXPECT_TRUE(validate(s).ok);
  // Stage 1 -> 2 stays on rank 1: no send or receive between them.
  EXPECT_EQ(names(s.per_rank[1]).find("1SEND_F"), std::string::npos);
  EXPECT_EQ(names(s.per_rank[1]).find("2RECV_F"), std::string::npos);
  // Written back (compute_comms), it reads the same, placement included.
  expect_same_schedule(schedule_from_csv(schedule_to_csv(s, ScheduleCsvFormat::kComputeComms), "again"), s, "zbv");
  expect_same_schedule(schedule_from_csv(schedule_to_csv(s, ScheduleCsvFormat::kComputeOnly), "again"),
                       [&] {
                         Schedule compute = s;
                         for (auto& prog : compute.per_rank)
                           std::erase_if(prog, [](const Action& a) { return is_communication(a.type); });
                         return compute;
                       }(),
                       "zbv compute-only");
}

TEST(ScheduleCsv, ExpandsOverlapFB) {
  const Schedule s = schedule_from_csv(kTorchDualPipeVComputeOnly, "torch_dualpipev.csv");
  EXPECT_EQ(placement(s), (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(names(s.per_rank[0]), "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3");
  const Schedule lowered = with_communication(s);
  EXPECT_TRUE(validate(lowered).ok) << render_grid(lowered, validate(lowered));
}

TEST(ScheduleCsv, PlacementOtherThanStageModRanks) {
  // One stage per rank, reversed: stage 0 on rank 1, stage 1 on rank 0.
  const Schedule s = schedule_from_csv("1F0,1B0\n0F0,0B0\n", "reversed.csv");
  EXPECT_EQ(placement(s), (std::vector<int>{1, 0}));
  EXPECT_EQ(s.rank_of_stage(0), 1);
  const Schedule lowered = with_communication(s);
  EXPECT_EQ(names(lowered.per_rank[0]), "1RECV_F0 1F0 1B0 1SEND_B0");
  EXPECT_EQ(names(lowered.per_rank[1]), "0F0 0SEND_F0 0RECV_B0 0B0");
  EXPECT_TRUE(validate(lowered).ok);
  // The grid names the stage when the column does not say it.
  EXPECT_THAT(render_grid(lowered, validate(lowered)), HasSubstr("1F0"));
}

TEST(ScheduleCsv, ValidatorChecksAnExplicitPlacement) {
  Schedule s = make_schedule(ScheduleKind::kOneFOneB, 2, 2);
  s.stage_to_rank = {0, 0};  // both stages on rank 0, none on rank 1
  ValidationResult r = validate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_THAT(r.issues.front().message, HasSubstr("malformed placement"));
  s.stage_to_rank = {0, 2};  // no rank 2
  EXPECT_FALSE(validate(s).ok);
  s.stage_to_rank = {1, 0};  // fine as a placement, but the programs hold the other stages
  r = validate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_THAT(r.issues.front().message, HasSubstr("lives on rank 1"));
}

TEST(ScheduleCsv, DropsUnshardReshardAndReduceGrad) {
  const Schedule s = schedule_from_csv("0UNSHARD,0F0,0B0,0REDUCE_GRAD,0RESHARD\n", "fsdp.csv");
  EXPECT_EQ(names(s.per_rank[0]), "0F0 0B0");
}

TEST(ScheduleCsv, ErrorsNameFileRowColumnAndCell) {
  EXPECT_THAT(read_error("0F0,0B0\n1F0,1X0\n"),
              AllOf(HasSubstr("bad.csv, row 2 (rank 1), column 2"), HasSubstr("'1X0'"), HasSubstr("unknown action type"),
                    HasSubstr("expected"), HasSubstr("SEND_F")));
  EXPECT_THAT(read_error("0F0,0B\n"), AllOf(HasSubstr("column 2"), HasSubstr("'0B'"), HasSubstr("no micro-batch")));
  EXPECT_THAT(read_error("0F0x,0B0\n"), AllOf(HasSubstr("column 1"), HasSubstr("'0F0x'"), HasSubstr("'x'")));
  EXPECT_THAT(read_error("F0,0B0\n"), AllOf(HasSubstr("'F0'"), HasSubstr("stage index")));
  EXPECT_THAT(read_error("0F0,0UNSHARD1,0B0\n"), AllOf(HasSubstr("'0UNSHARD1'"), HasSubstr("no micro-batch")));
  EXPECT_THAT(read_error("0F0,\"0B0\"\n"), AllOf(HasSubstr("column 2"), HasSubstr("quoted")));
  EXPECT_THAT(read_error("0F0,0F99999999999\n"), HasSubstr("too large"));
  // A typo'd index that fits an int: named at its cell, before the validator would size tables
  // for 10^9 micro-batches (it used to exhaust memory, or print 22 MB of issues).
  EXPECT_THAT(read_error("0F0,0B0,0F999999999,0B999999999\n"),
              AllOf(HasSubstr("bad.csv, row 1 (rank 0), column 3 ('0F999999999') names micro-batch 999999999"),
                    HasSubstr("only 4 action(s)"),
                    HasSubstr("typo")));
  EXPECT_THAT(read_error("0F0,(0B0;0SEND_B0)OVERLAP_F_B\n"), HasSubstr("compute actions"));
  EXPECT_THAT(read_error("0F0,(0B0;0F1)OVERLAP\n"), HasSubstr("only (<action>;<action>)OVERLAP_F_B"));
  EXPECT_THAT(read_error(""), HasSubstr("no rows"));
  EXPECT_THAT(read_error(",,\n"), HasSubstr("names no stage"));
}

TEST(ScheduleCsv, ErrorsOnStagesThatDoNotFitOnePlacement) {
  // Stage 0 in two rows.
  EXPECT_THAT(read_error("0F0,1F0,1B0,0B0\n0F1,1F1,1B1,0B1\n"),
              AllOf(HasSubstr("row 2 (rank 1), column 1"), HasSubstr("'0F1'"), HasSubstr("stage 0 on rank 1"),
                    HasSubstr("row 1 (rank 0), column 1 ('0F0') already put it on rank 0")));
  // Stage 1 nowhere.
  EXPECT_THAT(read_error("0F0,0B0\n2F0,2B0\n"), HasSubstr("stage 1 appears in no row"));
  // Two stages on rank 0, one on rank 1.
  EXPECT_THAT(read_error("0F0,2F0,2B0,0B0\n1F0,1B0\n"),
              AllOf(HasSubstr("row 2 (rank 1) holds stages {1}"), HasSubstr("rank 0) holds {0, 2}")));
}

TEST(ScheduleCsv, LoadedSchedulesAreValidatedWithIssuesTracedToCells) {
  // Compute-only, a backward before its forward.
  EXPECT_THAT(read_error("0B0,0F0\n"),
              AllOf(HasSubstr("does not validate"), HasSubstr("bad.csv, row 1 (rank 0), column 1 ('0B0')"),
                    HasSubstr("needs 0F0")));
  // Many issues: the first 20, then how many more.
  std::string backwards;
  for (int m = 0; m < 30; ++m) backwards += (m ? "," : "") + std::string("0B") + std::to_string(m);
  for (int m = 0; m < 30; ++m) backwards += ",0F" + std::to_string(m);
  EXPECT_THAT(read_error(backwards + "\n"), HasSubstr("... and "));
  // Missing micro-batch 1 of stage 1.
  EXPECT_THAT(read_error("0F0,0F1,0B0,0B1\n1F0,1B0\n"), HasSubstr("missing forward F of stage 1 micro-batch 1"));
  // With communication, receives in the wrong order: a mismatch on rank 1.
  EXPECT_THAT(read_error("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                         "1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1\n"),
              AllOf(HasSubstr("row 2 (rank 1), column 1 ('1RECV_F1')"), HasSubstr("mismatch")));
}

TEST(ScheduleCsv, LoadsAFileAndChecksItsShapeAgainstTheConfig) {
  EXPECT_THAT(error_of([] { load_schedule_csv("/no/such/schedule.csv"); }),
              HasSubstr("/no/such/schedule.csv: cannot open"));
  const TempFile file(kTorchDualPipeVComputeOnly, "dualpipev");
  ParallelConfig parallel;
  TrainingConfig training;
  parallel.schedule_file = file.path();
  parallel.model_parallel_size = 2;
  parallel.virtual_stages = 2;
  training.num_microbatches = 4;
  const Schedule s = schedule_from_file(parallel, training);  // lowered (it was compute-only) and valid
  EXPECT_TRUE(validate(s).ok);
  EXPECT_THAT(names(s.per_rank[0]), HasSubstr("0SEND_F0"));
  EXPECT_EQ(placement(s), (std::vector<int>{0, 1, 1, 0}));

  training.num_microbatches = 8;
  EXPECT_THAT(error_of([&] { schedule_from_file(parallel, training); }),
              AllOf(HasSubstr(file.path()), HasSubstr("4 micro-batch(es)"), HasSubstr("training.num_microbatches 8")));
  training.num_microbatches = 4;
  parallel.virtual_stages = 1;
  EXPECT_THAT(error_of([&] { schedule_from_file(parallel, training); }), HasSubstr("parallel.virtual_stages 1"));
}

TEST(ScheduleCsv, ConfigAcceptsAnyStagesPerRankWithAScheduleFile) {
  PipelineConfig c;
  c.parallel.model_parallel_size = 2;
  c.parallel.virtual_stages = 2;  // schedule stays 1f1b, which alone runs one stage per rank
  EXPECT_THROW(c.validate(), ConfigError);
  c.apply_override("parallel.schedule_file=zbv.csv");
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(PipelineConfig::from_yaml_string(c.to_yaml()).parallel.schedule_file, "zbv.csv");
}

TEST(ScheduleCsv, FromFileIsNotAGeneratorName) {
  EXPECT_STREQ(to_string(ScheduleKind::kFromFile), "file");
  EXPECT_THROW(parse_schedule_kind("file"), std::invalid_argument);
  EXPECT_THROW(make_schedule(ScheduleKind::kFromFile, 2, 2), std::invalid_argument);
}

}  // namespace
}  // namespace gpipe
