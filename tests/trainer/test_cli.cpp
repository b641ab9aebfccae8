// parse_cli(): flags, --set, direct flags, precedence, errors and exit codes, info actions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "trainer/cli/cli.h"
#include "trainer/schedule/schedule.h"
#include "trainer/schedule/schedule_csv.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RunOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gpipe_runner");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_cli(static_cast<int>(argv.size()), argv.data());
}

// Runs parse() expecting an exception; returns (exit code, the one line report_error printed).
std::pair<int, std::string> failure(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const std::exception& e) {
    std::ostringstream out, err;
    const int code = report_error(e, out, err);
    return {code, code == 0 ? out.str() : err.str()};
  }
  return {-1, "(no error)"};
}

class CliWithFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() / ("ourgpipe_cli_test_" + std::to_string(::getpid()) + ".yaml");
    std::ofstream(path_) << "model:\n  num_layers: 8\ntraining:\n  num_microbatches: 2\n  learning_rate: 0.01\n"
                            "parallel:\n  model_parallel_size: 2\n  schedule: gpipe\n";
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_;
};

TEST(Cli, NoFlagsGivesValidatedDefaults) {
  const RunOptions o = parse({});
  EXPECT_TRUE(o.config_path.empty());
  EXPECT_EQ(o.config, PipelineConfig{});
  EXPECT_FALSE(o.print_config || o.print_schedule || o.validate_only);
}

TEST_F(CliWithFile, FileThenSetThenDirectFlags) {
  const RunOptions o = parse({"--config", path_.string(), "--set", "training.learning_rate=3e-4", "--set",
                              "training.num_microbatches=4", "--microbatches", "1", "--scheduler", "naive"});
  EXPECT_EQ(o.config.model.num_layers, 8);                   // from the file
  EXPECT_DOUBLE_EQ(o.config.training.learning_rate, 3e-4);  // --set beats the file
  EXPECT_EQ(o.config.training.num_microbatches, 1);         // direct flag beats --set
  EXPECT_EQ(o.config.parallel.scheduler, "naive");
  EXPECT_EQ(o.overrides.front(), "training.learning_rate=3e-4");
}

TEST(Cli, DirectFlagsMapToFields) {
  const RunOptions o = parse({"--schedule", "interleaved_1f1b", "--virtual-stages", "2", "--stages", "2", "--microbatches",
                              "4", "--steps", "10", "--device", "cpu", "--output-dir", "runs/x", "--seed", "7",
                              "--dtype", "fp32", "--lr", "0.002"});
  EXPECT_EQ(o.config.parallel.schedule, "interleaved_1f1b");
  EXPECT_EQ(o.config.parallel.virtual_stages, 2);
  EXPECT_EQ(o.config.parallel.model_parallel_size, 2);
  EXPECT_EQ(o.config.training.num_microbatches, 4);
  EXPECT_EQ(o.config.training.max_steps, 10);
  EXPECT_EQ(o.config.parallel.device, "cpu");
  EXPECT_EQ(o.config.training.output_dir, "runs/x");
  EXPECT_EQ(o.config.training.seed, 7u);
  EXPECT_EQ(o.config.training.dtype, "fp32");
  EXPECT_DOUBLE_EQ(o.config.training.learning_rate, 0.002);
}

TEST(Cli, PartitionTakesAListOrAMethod) {
  RunOptions o = parse({"--partition", "[3,5,5,3]"});
  EXPECT_EQ(o.config.parallel.partition, "explicit");
  EXPECT_EQ(o.config.parallel.partition_layers, (std::vector<int64_t>{3, 5, 5, 3}));
  o = parse({"--set", "parallel.partition=explicit", "--set", "parallel.partition_layers=[3,5,5,3]", "--partition", "time"});
  EXPECT_EQ(o.config.parallel.partition, "time");
  EXPECT_TRUE(o.config.parallel.partition_layers.empty());
}

TEST(Cli, InfoFlags) {
  const RunOptions o = parse({"--print-config", "--print-schedule", "--validate-only"});
  EXPECT_TRUE(o.print_config && o.print_schedule && o.validate_only);
}

TEST(Cli, ErrorsAreOneLineWithExitCodes) {
  auto [code, line] = failure({"--bogus"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("--bogus"));
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << line;

  std::tie(code, line) = failure({"--config", "/no/such/config.yaml"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("/no/such/config.yaml"));

  std::tie(code, line) = failure({"--set", "training.learning_rate"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("section.field=value"));

  std::tie(code, line) = failure({"--microbatches", "three"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("training.num_microbatches"));
  // A flag's error names the flag as typed and the field it sets; a --set names the override.
  EXPECT_THAT(line, HasSubstr("error: --microbatches three: "));
  std::tie(code, line) = failure({"--schedule", "foo"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("error: --schedule foo: parallel.schedule: got 'foo'; allowed: gpipe, 1f1b"));
  EXPECT_THAT(line, Not(HasSubstr("override")));
  std::tie(code, line) = failure({"--partition", "[2,x]"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("error: --partition [2,x]: "));
  std::tie(code, line) = failure({"--set", "parallel.schedule=foo"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("error: override 'parallel.schedule=foo': parallel.schedule: got 'foo'"));

  std::tie(code, line) = failure({"--stages", "32"});  // more stages than the 16 default layers
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("32 stages"));

  std::tie(code, line) = failure({"--config"});  // missing value
  EXPECT_EQ(code, 2);
}

// Inputs that were accepted and then trained something else than asked (found by a review; each
// exited 0 before).
TEST(Cli, InputsThatTrainedSomethingElseAreRefused) {
  auto refused = [](std::vector<std::string> args, const std::string& needle) {
    const auto [code, line] = failure(args);
    EXPECT_EQ(code, 2) << line;
    EXPECT_THAT(line, HasSubstr(needle));
  };
  // The multi-node flags only mean something with --nproc-per-node: alone they were ignored, and
  // the process trained every rank by itself.
  refused({"--nnodes", "2", "--node-rank", "1"}, "--nproc-per-node");
  refused({"--master-addr", "node01"}, "--nproc-per-node");
  // An empty value (--steps "$STEPS" with STEPS unset) was dropped, and the config's value used.
  refused({"--steps", ""}, "--steps");
  refused({"--partition", ""}, "--partition");
  // Leading zeros and hex: YAML 1.1 read 010 as 8, so --microbatches 010 trained 8.
  refused({"--steps", "010"}, "training.max_steps");
  refused({"--set", "training.max_steps=0x10"}, "training.max_steps");
  EXPECT_EQ(parse({"--steps", "10"}).config.training.max_steps, 10);
  EXPECT_EQ(parse({"--steps", "-1"}).config.training.max_steps, -1);
  EXPECT_EQ(parse({"--seed", "0"}).config.training.seed, 0u);
}

TEST(Cli, HelpIsNotAnError) {
  auto [code, text] = failure({"--help"});
  EXPECT_EQ(code, 0);
  EXPECT_THAT(text, HasSubstr("--print-schedule"));
  EXPECT_THAT(text, HasSubstr("--set"));
}

TEST(Cli, ExitCodeMapping) {
  EXPECT_EQ(exit_code_for(CliHelp("h")), 0);
  EXPECT_EQ(exit_code_for(CliError("x")), 2);
  EXPECT_EQ(exit_code_for(ConfigError("x")), 2);
  EXPECT_EQ(exit_code_for(std::invalid_argument("unknown model 'x'")), 2);
  EXPECT_EQ(exit_code_for(std::runtime_error("x")), 1);
}

TEST(Cli, InfoActions) {
  std::ostringstream out;
  RunOptions o = parse({"--print-config", "--lr", "0.5"});
  EXPECT_EQ(run_info_actions(o, out), 0);
  EXPECT_EQ(PipelineConfig::from_yaml_string(out.str()), o.config);

  out.str("");
  o = parse({"--print-schedule", "--stages", "2", "--microbatches", "2"});
  EXPECT_EQ(run_info_actions(o, out), 0);
  EXPECT_THAT(out.str(), ::testing::ContainsRegex("step +\\| rank 0 +\\| rank 1\n"));
  EXPECT_THAT(out.str(), HasSubstr("simulated bubble 33.3%"));  // (p-1)/(m+p-1) = 1/3

  out.str("");
  o = parse({"--validate-only", "--schedule", "zb_h1"});
  EXPECT_EQ(run_info_actions(o, out), 0);
  EXPECT_THAT(out.str(), HasSubstr("schedule zb_h1 ok"));

  // --validate-only refuses what the run refuses: one stream per rank with overlapped pairs
  // (async_threaded), and says what a replicated config needs to be launched with.
  o = parse({"--validate-only", "--schedule", "dualpipev", "--virtual-stages", "2", "--stages", "2", "--set",
             "parallel.streams=per_rank"});
  try {
    run_info_actions(o, out);
    ADD_FAILURE() << "per_rank streams with dualpipev's pairs validated";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("parallel.streams=per_rank"));
    EXPECT_THAT(e.what(), HasSubstr("parallel.overlap_f_b=false"));
  }
  out.str("");
  o = parse({"--validate-only", "--schedule", "dualpipev", "--virtual-stages", "2", "--stages", "2", "--set",
             "parallel.streams=per_rank", "--scheduler", "naive"});
  EXPECT_EQ(run_info_actions(o, out), 0) << "one stream is all the naive executor has";
  out.str("");
  o = parse({"--validate-only", "--stages", "2", "--data-parallel-size", "2"});
  EXPECT_EQ(run_info_actions(o, out), 0);
  EXPECT_THAT(out.str(), HasSubstr("parallel.data_parallel_size=2: launch a multiple of 2 processes"));
  EXPECT_THAT(out.str(), Not(HasSubstr("parallel.device=cuda")));
  out.str("");
  EXPECT_EQ(run_info_actions(parse({"--validate-only", "--device", "cuda"}), out), 0);
  EXPECT_THAT(out.str(), HasSubstr("parallel.device=cuda: not checked here"));
  EXPECT_THAT(out.str(), Not(HasSubstr("model.attention")));
  out.str("");
  EXPECT_EQ(run_info_actions(parse({"--validate-only", "--set", "model.attention=cudnn"}), out), 0);
  EXPECT_THAT(out.str(), HasSubstr("model.attention=cudnn: not checked here"));

  o = parse({});
  EXPECT_EQ(run_info_actions(o, out), std::nullopt);
}

TEST(Cli, PrintScheduleAsCsvAndRunAScheduleFile) {
  std::ostringstream out;
  RunOptions o = parse({"--print-schedule", "--format", "csv", "--stages", "2", "--microbatches", "2"});
  EXPECT_EQ(run_info_actions(o, out), 0);
  const std::string csv = out.str();
  EXPECT_EQ(csv, schedule_to_csv(with_communication(make_schedule(ScheduleKind::kOneFOneB, 2, 2)),
                                 ScheduleCsvFormat::kComputeComms));
  out.str("");
  o = parse({"--print-schedule", "--format", "csv_compute_only", "--stages", "2", "--microbatches", "2"});
  EXPECT_EQ(run_info_actions(o, out), 0);
  EXPECT_EQ(out.str(), "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1\n");

  // The printed file, given back with --schedule-file, is the schedule that runs.
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("ourgpipe_cli_schedule_" + std::to_string(::getpid()) + ".csv");
  std::ofstream(path) << csv;
  const std::vector<std::string> file = {"--schedule-file", path.string(), "--stages", "2", "--microbatches", "2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), file.begin(), file.end());
    return parse(more);
  };
  o = with({"--print-schedule", "--format", "csv"});
  EXPECT_EQ(o.config.parallel.schedule_file, path.string());
  out.str("");
  EXPECT_EQ(run_info_actions(o, out), 0);
  EXPECT_EQ(out.str(), csv);
  out.str("");
  EXPECT_EQ(run_info_actions(with({"--print-schedule"}), out), 0);
  EXPECT_THAT(out.str(), HasSubstr("schedule file " + path.string() + ": 2 rank(s)"));
  EXPECT_THAT(out.str(), HasSubstr("simulated bubble 33.3%"));
  out.str("");
  EXPECT_EQ(run_info_actions(with({"--validate-only"}), out), 0);
  EXPECT_THAT(out.str(), HasSubstr("ok"));

  // A file that does not fit the config: exit code 2, naming the file and the field.
  o = parse({"--schedule-file", path.string(), "--stages", "4", "--microbatches", "2", "--print-schedule"});
  try {
    run_info_actions(o, out);
    ADD_FAILURE() << "a 2-rank file ran with --stages 4";
  } catch (const std::exception& e) {
    std::ostringstream o2, err;
    EXPECT_EQ(report_error(e, o2, err), 2);
    EXPECT_THAT(err.str(), HasSubstr(path.string()));
    EXPECT_THAT(err.str(), HasSubstr("parallel.model_parallel_size 4"));
  }
  std::filesystem::remove(path);

  auto [code, line] = failure({"--format", "csv"});  // needs --print-schedule
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("--print-schedule"));
  std::tie(code, line) = failure({"--print-schedule", "--format", "xml"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(line, HasSubstr("xml"));
}

}  // namespace
}  // namespace gpipe
