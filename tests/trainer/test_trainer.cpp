// The runner's config path (create_components + PipelineTrainer) over the registered GPT and the
// embedded corpus: impossible configs give their named errors, and a small GPT's loss falls.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "synthetic/synthetic_layers.h"
#include "temp_dir.h"
#include "trainer/config/config.h"
#include "trainer/device/device.h"
#include "trainer/training/trainer.h"

namespace gpipe {
namespace {

PipelineConfig small_gpt_config() {
  PipelineConfig c;
  c.model.name = "gpt";
  c.model.hidden_size = 64;
  c.model.num_layers = 4;
  c.model.num_heads = 4;
  c.model.sequence_length = 32;
  c.dataset.name = "code_search_net";
  c.dataset.batch_size = 8;
  c.training.num_microbatches = 4;
  c.training.learning_rate = 3e-3;
  c.training.warmup_steps = 5;
  c.training.max_steps = 40;
  c.training.epochs = 100;
  c.training.log_interval = 10;
  c.training.exit_after_profile = false;
  c.training.output_dir = testing::fresh_temp_dir("trainer_test");
  c.parallel.model_parallel_size = 2;
  c.parallel.schedule = "1f1b";
  c.parallel.scheduler = "async_threaded";
  c.parallel.device = "cpu";
  return c;
}

// Builds the pipeline as gpipe_runner does and expects a ConfigError whose message names `field`.
void expect_config_error(const std::function<void(PipelineConfig&)>& edit, const std::string& field) {
  PipelineConfig c = small_gpt_config();
  edit(c);
  try {
    PipelineComponents parts = create_components(c);
    PipelineTrainer trainer(c, std::move(parts));
    FAIL() << "no error for a config with a bad " << field;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << "message: " << e.what();
  }
}

TEST(TrainerConfigTest, MicrobatchesMustDivideTheBatch) {
  expect_config_error([](PipelineConfig& c) { c.training.num_microbatches = 3; }, "num_microbatches");
}
TEST(TrainerConfigTest, UnknownScheduleIsNamed) {
  expect_config_error([](PipelineConfig& c) { c.parallel.schedule = "2f2b"; }, "parallel.schedule");
}
TEST(TrainerConfigTest, UnknownExecutorIsNamed) {
  expect_config_error([](PipelineConfig& c) { c.parallel.scheduler = "turbo"; }, "parallel.scheduler");
}
// One stream per rank cannot run an overlapped pair's halves at once: refused, naming both fields.
TEST(TrainerConfigTest, PerRankStreamsWithOverlappedPairsAreRefused) {
  expect_config_error([](PipelineConfig& c) {
    c.parallel.streams = "per_rank";
    c.parallel.overlap_f_b = "true";
  }, "parallel.streams=per_rank");
  expect_config_error([](PipelineConfig& c) {
    c.parallel.streams = "per_rank";
    c.parallel.overlap_f_b = "true";
  }, "parallel.overlap_f_b=false");
  for (const bool pairs : {false, true}) {
    PipelineConfig c = small_gpt_config();  // without pairs, or with the naive executor (one stream), it builds
    c.parallel.streams = "per_rank";
    if (pairs) {
      c.parallel.overlap_f_b = "true";
      c.parallel.scheduler = "naive";
    }
    PipelineComponents parts = create_components(c);
    EXPECT_NO_THROW(PipelineTrainer(c, std::move(parts))) << (pairs ? "naive with pairs" : "async without pairs");
  }
}
// As torch 2.11: the micro-batches split into max(1, m / ranks) equal rounds. 9 on 4 ranks is 2
// rounds of 4.5 (2 micro-batches on 4 ranks, one partial round, is fine).
TEST(TrainerConfigTest, InterleavedNeedsMicrobatchesInEqualRounds) {
  expect_config_error(
      [](PipelineConfig& c) {
        c.parallel.schedule = "interleaved_1f1b";
        c.parallel.virtual_stages = 2;
        c.parallel.model_parallel_size = 4;
        c.model.num_layers = 8;
        c.dataset.batch_size = 18;
        c.training.num_microbatches = 9;
      },
      "num_microbatches");
}
// A model that cannot fit the machine is refused before anything is built (it used to hang
// building 10^12 blocks): the estimate names the fields, and the refusal takes no time.
TEST(TrainerConfigTest, AModelTooLargeForTheMachineIsRefusedBeforeBuilding) {
  const auto start = std::chrono::steady_clock::now();
  expect_config_error([](PipelineConfig& c) { c.model.num_layers = 1000000000000; }, "model.num_layers=1000000000000");
  expect_config_error([](PipelineConfig& c) { c.model.num_layers = 1000000000000; }, "16 bytes each");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << "it built something first";
  // Wide instead of deep: the activations or the state exceed it just the same.
  expect_config_error([](PipelineConfig& c) { c.model.hidden_size = 4096 * 64; c.model.num_heads = 64; }, "cannot fit");
}

TEST(TrainerConfigTest, MoreStagesThanLayersIsNamed) {
  expect_config_error([](PipelineConfig& c) { c.parallel.model_parallel_size = 8; }, "num_layers");
}
TEST(TrainerConfigTest, UnknownModelIsNamed) {
  expect_config_error([](PipelineConfig& c) { c.model.name = "no_such_model"; }, "model.name");
}
TEST(TrainerConfigTest, MissingDataFileIsNamed) {
  expect_config_error([](PipelineConfig& c) { c.dataset.path = "/nonexistent/corpus.jsonl"; }, "/nonexistent/corpus.jsonl");
}
TEST(TrainerConfigTest, CudaAskedWithoutCudaIsNamed) {
  if (cuda_usable()) GTEST_SKIP() << "a GPU is visible: the missing-CUDA error needs a machine without one";
  expect_config_error([](PipelineConfig& c) { c.parallel.device = "cuda"; }, "parallel.device");
}
TEST(TrainerConfigTest, Bf16OnCpuIsNamed) {
  expect_config_error([](PipelineConfig& c) { c.training.dtype = "bf16"; }, "training.dtype");
}
TEST(TrainerConfigTest, VocabSmallerThanTokenizerIsNamed) {
  expect_config_error([](PipelineConfig& c) { c.model.vocab_size = 10; }, "model.vocab_size");
}

TEST(TrainerTest, ResolvesVocabFromTheTokenizer) {
  PipelineConfig c = small_gpt_config();
  ASSERT_EQ(c.model.vocab_size, -1);
  PipelineComponents parts = create_components(c);
  EXPECT_EQ(c.model.vocab_size, parts.dataset->get_tokenizer().vocab_size());
  EXPECT_GT(c.model.vocab_size, 0);
}

TEST(TrainerTest, SmallGptLossFallsOnTheEmbeddedCorpus) {
  at::set_num_threads(1);
  PipelineConfig c = small_gpt_config();
  testing::remove_tree(c.training.output_dir);
  PipelineComponents parts = create_components(c);
  PipelineTrainer trainer(c, std::move(parts));
  const auto unix_now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  const double began = unix_now();
  const nlohmann::json summary = trainer.train();
  const double ended = unix_now();
  const double first = summary.at("first_loss").get<double>();
  const double last = summary.at("final_loss").get<double>();
  EXPECT_EQ(summary.at("steps").get<int>(), 40);
  EXPECT_LT(last, first - 1.0) << "loss " << first << " -> " << last;
  EXPECT_TRUE(summary.at("mfu").is_null()) << "MFU is n/a on CPU";
  EXPECT_GT(summary.at("tokens_per_s").get<double>(), 0.0);
  const std::filesystem::path out(c.training.output_dir);
  EXPECT_TRUE(std::filesystem::exists(out / "metrics.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(out / "timeline.json"));
  // Each step's end on the system clock, inside the run, no sooner after the previous one than
  // the step's own time.
  std::ifstream lines(out / "metrics.jsonl");
  double previous_end = began;
  int steps = 0;
  for (std::string line; std::getline(lines, line); ++steps) {
    const auto m = nlohmann::json::parse(line);
    const double end = m.at("end_unix_s").get<double>();
    EXPECT_GE(end - previous_end, m.at("step_time_ms").get<double>() / 1e3 - 1e-3) << "step " << m.at("step");
    EXPECT_LE(end, ended);
    previous_end = end;
  }
  EXPECT_EQ(steps, 40);
  std::ifstream in(out / "summary.json");
  EXPECT_EQ(nlohmann::json::parse(in).at("executor"), "async_threaded");
  testing::remove_tree(out.string());
}

// One run writes a checkpoint folder at a time (an flock on <checkpoint_dir>/.gpipe_lock, held
// until the trainer goes): a second run into it is refused before its first step instead of
// racing the first's temporary files, manifests and prunes. Once the first is gone, a resume goes.
TEST(TrainerTest, ASecondRunIntoACheckpointFolderInUseIsRefused) {
  PipelineConfig c = small_gpt_config();
  c.training.max_steps = 2;
  c.training.checkpoint_interval = 1;
  c.training.checkpoint_dir = c.training.output_dir + "/ckpt";
  auto first = std::make_unique<PipelineTrainer>(c, create_components(c));
  first->train();
  PipelineConfig again = c;
  again.training.output_dir = c.training.output_dir + "/again";
  again.training.max_steps = 3;
  {
    PipelineTrainer second(again, create_components(again));
    second.resume_from("");
    try {
      second.train();
      ADD_FAILURE() << "a second run wrote into a checkpoint folder in use";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("is being written by another run"), std::string::npos) << e.what();
    }
  }
  first.reset();
  PipelineTrainer third(again, create_components(again));
  third.resume_from("");
  EXPECT_EQ(third.train().at("steps").get<int>(), 1) << "resumed at step 2, one step to go";
  testing::remove_tree(c.training.output_dir);
}

// The LR schedule spans the steps the run takes: the epochs' end when it comes before
// training.max_steps (the cosine schedule used to span max_steps and never decay).
TEST(TrainerTest, TheLearningRateScheduleSpansTheStepsTheRunTakes) {
  PipelineConfig c = small_gpt_config();
  c.training.epochs = 1;
  c.training.max_steps = 1'000'000;
  PipelineComponents parts = create_components(c);
  const int64_t batches = parts.dataset->num_batches();
  ASSERT_GT(batches, 0);
  ASSERT_LT(batches, 1'000'000);
  PipelineTrainer trainer(c, std::move(parts));
  EXPECT_EQ(trainer.planned_steps(), batches);
  EXPECT_EQ(trainer.total_steps(), batches);
  PipelineConfig sooner = small_gpt_config();  // max_steps 40 before 100 epochs' end
  PipelineTrainer by_max_steps(sooner, create_components(sooner));
  EXPECT_EQ(by_max_steps.total_steps(), 40);
}

// The synthetic model (model.name: synthetic) trains through the runner's path under plain and
// zero-bubble schedules: every layer's input-gradient and weight-gradient wait runs exactly once
// per micro-batch (ZB-H1 defers the weight part to W), and no activation outlives its backward.
// parallel.publish_bubbles_gpu=auto resolves the publishing rank's GPU UUID; on CPU there is none,
// and train() says so, naming the key, before it attaches to any daemon.
TEST(TrainerConfigTest, PublishBubblesAutoOnCpuIsNamed) {
  PipelineConfig c = small_gpt_config();
  c.parallel.publish_bubbles_gpu = "auto";
  c.training.max_steps = 1;
  PipelineComponents parts = create_components(c);
  PipelineTrainer trainer(c, std::move(parts));
  try {
    trainer.train();
    FAIL() << "publish_bubbles_gpu=auto ran on a CPU device";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.publish_bubbles_gpu=auto"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a CUDA GPU"), std::string::npos) << e.what();
  }
  testing::remove_tree(c.training.output_dir);
}

TEST(DeviceTest, GpuUuidsAreSpelledAsNvidiaSmiDoes) {
  const unsigned char bytes[16] = {0x8f, 0x3a, 0x01, 0x2b, 0xcd, 0xef, 0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe, 0x00, 0x11};
  EXPECT_EQ(format_gpu_uuid(bytes), "GPU-8f3a012b-cdef-1032-5476-98badcfe0011");
}

TEST(TrainerTest, SyntheticModelRunsEveryPartOncePerMicrobatchUnderPlainAndZeroBubbleSchedules) {
  for (const char* schedule : {"1f1b", "zb_h1"}) {
    SCOPED_TRACE(schedule);
    PipelineConfig c = small_gpt_config();
    c.model.name = "synthetic";
    c.model.num_layers = 6;
    c.model.synthetic = {0.5, 0.5, 0.5, 256};
    c.training.max_steps = 3;
    c.parallel.schedule = schedule;
    auto& n = synthetic::counters();
    const int64_t forwards = n.forwards.load(), inputs = n.input_grads.load(), weights = n.weight_grads.load();
    PipelineComponents parts = create_components(c);
    PipelineTrainer trainer(c, std::move(parts));
    const nlohmann::json summary = trainer.train();
    EXPECT_EQ(summary.at("steps").get<int>(), 3);
    const int64_t layers = c.model.num_layers + 2, microbatches = 3 * c.training.num_microbatches;
    EXPECT_EQ(n.forwards.load() - forwards, layers * microbatches);
    EXPECT_EQ(n.input_grads.load() - inputs, (layers - 1) * microbatches) << "the input layer has no input gradient";
    EXPECT_EQ(n.weight_grads.load() - weights, layers * microbatches);
    EXPECT_EQ(n.activations_held.load(), 0);
    testing::remove_tree(c.training.output_dir);
  }
}

// training.profile_iteration writes a PyTorch profiler (Kineto) trace as the Python OurGPipe
// does: <output_dir>/profiler_<executor>/rank<N>/<host>_<pid>.<ms>.pt.trace.json, a Chrome trace
// holding the step's ATen ops from the rank threads (2 ranks: at least 2 threads with ops) and
// the autograd engine's backward ops.
TEST(TrainerTest, ProfiledStepWritesAKinetoTraceFromEveryRankThread) {
  at::set_num_threads(1);
  PipelineConfig c = small_gpt_config();
  c.training.max_steps = 3;
  c.training.profile_iteration = 1;
  c.training.output_dir += "_kineto";
  testing::remove_tree(c.training.output_dir);
  PipelineComponents parts = create_components(c);
  PipelineTrainer trainer(c, std::move(parts));
  trainer.train();
  const std::filesystem::path dir = std::filesystem::path(c.training.output_dir) / "profiler_async_threaded" / "rank0";
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  std::vector<std::filesystem::path> traces;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 14 && name.substr(name.size() - 14) == ".pt.trace.json") traces.push_back(entry.path());
  }
  ASSERT_EQ(traces.size(), 1u) << "one trace per process, named <host>_<pid>.<ms>.pt.trace.json";
  std::ifstream in(traces.front());
  const nlohmann::json trace = nlohmann::json::parse(in);
  ASSERT_TRUE(trace.contains("traceEvents"));
  std::set<int64_t> op_threads;
  std::set<std::string> thread_names;  // Kineto spells them "thread <tid> (<name>)"
  bool saw_matmul = false, saw_backward = false;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      thread_names.insert(e.at("args").value("name", ""));
    }
    if (!e.contains("name") || !e.contains("cat") || e.at("cat") != "cpu_op") continue;
    const std::string name = e.at("name").get<std::string>();
    if (name.rfind("aten::", 0) == 0 && e.contains("tid") && e.at("tid").is_number()) op_threads.insert(e.at("tid").get<int64_t>());
    saw_matmul = saw_matmul || name == "aten::mm" || name == "aten::addmm" || name == "aten::matmul";
    saw_backward = saw_backward || name.find("Backward") != std::string::npos;
  }
  EXPECT_TRUE(saw_matmul) << "no matrix multiply recorded";
  EXPECT_TRUE(saw_backward) << "no autograd backward op recorded";
  EXPECT_GE(op_threads.size(), 2u) << "ops of only one thread: the rank threads did not join the profile";
  for (const std::string rank : {"(rank0)", "(rank1)"}) {
    EXPECT_TRUE(std::any_of(thread_names.begin(), thread_names.end(),
                            [&](const std::string& n) { return n.find(rank) != std::string::npos; }))
        << "no thread named " << rank << " in the trace: Perfetto would show anonymous threads";
  }
  testing::remove_tree(c.training.output_dir);
}

TEST(TrainerTest, SameSeedSameLosses) {
  at::set_num_threads(1);
  auto run = [] {
    PipelineConfig c = small_gpt_config();
    c.training.max_steps = 3;
    c.training.output_dir += "_seed";
    PipelineComponents parts = create_components(c);
    PipelineTrainer trainer(c, std::move(parts));
    const auto summary = trainer.train();
    testing::remove_tree(c.training.output_dir);
    return std::make_pair(summary.at("first_loss").get<double>(), summary.at("final_loss").get<double>());
  };
  const auto a = run();
  const auto b = run();
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(a.second, b.second);
  EXPECT_NE(a.first, a.second) << "the optimizer changed nothing";
}

// Dropout masks are a function of (seed, step, micro-batch, layer, site), not of which thread
// drew first: the same losses under either executor, a schedule that orders forwards otherwise
// (GPipe: every forward before any backward), another partition. With the process-wide generator
// the masks followed the order of forwards, and the rank threads' interleaving.
TEST(TrainerTest, DropoutMasksDoNotDependOnExecutorScheduleOrPartition) {
  at::set_num_threads(1);
  auto losses = [](const std::function<void(PipelineConfig&)>& edit) {
    PipelineConfig c = small_gpt_config();
    c.model.dropout = 0.2;
    c.training.max_steps = 3;
    c.training.output_dir += "_dropout";
    c.parallel.model_parallel_size = 4;
    edit(c);
    PipelineComponents parts = create_components(c);
    PipelineTrainer trainer(c, std::move(parts));
    const auto summary = trainer.train();
    testing::remove_tree(c.training.output_dir);
    return std::make_pair(summary.at("first_loss").get<double>(), summary.at("final_loss").get<double>());
  };
  const auto naive = losses([](PipelineConfig& c) { c.parallel.scheduler = "naive"; });
  const auto threaded = losses([](PipelineConfig&) {});
  const auto gpipe = losses([](PipelineConfig& c) { c.parallel.schedule = "gpipe"; });
  const auto two_stages = losses([](PipelineConfig& c) { c.parallel.model_parallel_size = 2; });
  const auto without = losses([](PipelineConfig& c) { c.model.dropout = 0.0; });
  for (const auto& [name, run] : {std::pair{"async_threaded", threaded}, {"gpipe", gpipe}, {"2 stages", two_stages}}) {
    EXPECT_NEAR(run.first, naive.first, 1e-6) << name;
    EXPECT_NEAR(run.second, naive.second, 1e-5) << name;
  }
  EXPECT_GT(std::abs(naive.first - without.first), 1e-4) << "dropout 0.2 changed nothing";
}

}  // namespace
}  // namespace gpipe
