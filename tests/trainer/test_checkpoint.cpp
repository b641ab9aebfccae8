// Per-stage checkpoints: a restored stage trains on exactly as the original; damaged, foreign,
// interrupted and mismatched checkpoints are refused; discovery and pruning by step.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/config/config.h"

namespace gpipe {
namespace {

// Two linear layers and a buffer that training changes (a forward-call counter).
class TwoLayerNet : public torch::nn::Module {
 public:
  explicit TwoLayerNet(int64_t hidden) {
    fc1_ = register_module("fc1", torch::nn::Linear(4, hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(hidden, 3));
    calls_ = register_buffer("calls", at::zeros({1}, at::kLong));
  }
  at::Tensor forward(const at::Tensor& x) {
    calls_.add_(1);
    return fc2_->forward(at::tanh(fc1_->forward(x)));
  }

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  at::Tensor calls_;
};

// A stage as the trainer holds it: module + AdamW. Each step draws its batch from the device's
// default generator, so identical losses after a restore also need the RNG state restored.
struct Trainee {
  explicit Trainee(int64_t hidden = 8, c10::Device device = at::kCPU)
      : device(device),
        net(moved(std::make_shared<TwoLayerNet>(hidden), device)),
        optimizer(net->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.1)) {}
  double step() {
    const at::Tensor x = at::randn({16, 4}, at::TensorOptions().device(device));
    const at::Tensor y = at::randn({16, 3}, at::TensorOptions().device(device));
    optimizer.zero_grad();
    at::Tensor loss = at::mse_loss(net->forward(x), y);
    loss.backward();
    optimizer.step();
    return loss.item<double>();
  }
  static std::shared_ptr<TwoLayerNet> moved(std::shared_ptr<TwoLayerNet> net, c10::Device device) {
    net->to(device);
    return net;
  }
  c10::Device device;
  std::shared_ptr<TwoLayerNet> net;
  torch::optim::AdamW optimizer;
};

const std::string kHash = config_hash("model: tiny\nstages: 1\n");

// One complete single-stage checkpoint of `trainee` at `step` under root.
std::string save_complete(const std::string& root, int64_t step, Trainee& trainee, const std::string& config_yaml = {},
                          const std::string& hash = kHash) {
  const std::string folder = checkpoint_folder(root, step);
  Manifest manifest;
  manifest.position = {step, 0, step};
  manifest.config_hash = hash;
  manifest.config_yaml = config_yaml;
  manifest.num_stages = 1;
  manifest.stages.push_back(
      write_stage_checkpoint(folder, 0, *trainee.net, trainee.optimizer, trainee.device, manifest.position, hash));
  write_manifest(folder, manifest);
  return folder;
}

void expect_checkpoint_error(const std::function<void()>& action, const std::vector<std::string>& fragments) {
  try {
    action();
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    for (const auto& fragment : fragments) EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

bool same_parameters(torch::nn::Module& a, torch::nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return false;
  for (const auto& item : pa) {
    if (!at::equal(item.value(), pb[item.key()])) return false;
  }
  return true;
}

TEST(CheckpointTest, FolderNamesAndConfigHash) {
  EXPECT_EQ(checkpoint_folder("/ckpt", 42), "/ckpt/step_00000042");
  EXPECT_EQ(config_hash(""), "00000000");
  EXPECT_EQ(config_hash("hello"), "3610a686");  // zlib crc32 of "hello"
  EXPECT_NE(config_hash("a: 1\n"), config_hash("a: 2\n"));
}

// Checkpoints after 3 steps, trains 2 more; a fresh stage restored from the checkpoint must draw the
// same random numbers and produce the same 2 losses and parameters.
void expect_identical_training_after_restore(c10::Device device) {
  testing::TempDir dir;
  at::manual_seed(1);
  Trainee original(8, device);
  for (int i = 0; i < 3; ++i) original.step();
  const std::string folder = save_complete(dir.path(), 3, original);
  const at::Tensor rand_after_save = at::rand({8}, at::TensorOptions().device(device));
  std::vector<double> losses;
  for (int i = 0; i < 2; ++i) losses.push_back(original.step());

  at::manual_seed(2);
  Trainee restored(8, device);
  restored.step();  // its own optimizer state and a different RNG position, both to be replaced
  ASSERT_FALSE(same_parameters(*original.net, *restored.net));
  const Manifest manifest = read_manifest(folder, kHash, 1);
  EXPECT_EQ(manifest.position, (TrainingPosition{3, 0, 3}));
  ASSERT_EQ(manifest.stages.size(), 1u);
  EXPECT_EQ(manifest.stages[0].bytes, std::filesystem::file_size(folder + "/stage_0.pt"));
  EXPECT_EQ(read_stage_checkpoint(folder, 0, *restored.net, restored.optimizer, device), (TrainingPosition{3, 0, 3}));

  EXPECT_TRUE(at::equal(at::rand({8}, at::TensorOptions().device(device)), rand_after_save));
  std::vector<double> restored_losses;
  for (int i = 0; i < 2; ++i) restored_losses.push_back(restored.step());
  EXPECT_EQ(restored_losses, losses);
  EXPECT_TRUE(same_parameters(*original.net, *restored.net));
  EXPECT_TRUE(at::equal(original.net->named_buffers()["calls"], restored.net->named_buffers()["calls"]));
  EXPECT_EQ(original.net->named_buffers()["calls"].item<int64_t>(), 5);
}

TEST(CheckpointTest, RestoredStageTrainsOnIdentically) { expect_identical_training_after_restore(at::kCPU); }

TEST(CheckpointTest, RestoredCudaStageTrainsOnIdentically) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_identical_training_after_restore(c10::Device(c10::kCUDA, 0));
}

TEST(CheckpointTest, ManifestRoundTripsAndNeedsEveryStage) {
  testing::TempDir dir;
  Trainee first, second;
  const std::string folder = checkpoint_folder(dir.path(), 7);
  Manifest manifest;
  manifest.position = {7, 1, 2};
  manifest.config_hash = kHash;
  manifest.num_stages = 2;
  manifest.world_size = 2;
  manifest.stages.push_back(
      write_stage_checkpoint(folder, 1, *second.net, second.optimizer, at::kCPU, manifest.position, kHash));
  manifest.stages.push_back(
      write_stage_checkpoint(folder, 0, *first.net, first.optimizer, at::kCPU, manifest.position, kHash));
  write_manifest(folder, manifest);
  const Manifest read = read_manifest(folder, kHash, 2);
  EXPECT_EQ(read.position, manifest.position);
  EXPECT_EQ(read.world_size, 2);
  ASSERT_EQ(read.stages.size(), 2u);
  EXPECT_EQ(read.stages[0].stage, 0);
  EXPECT_EQ(read.stages[1].file, "stage_1.pt");
  EXPECT_EQ(read.stages[1].crc32, manifest.stages[0].crc32);
  expect_checkpoint_error([&] { read_manifest(folder, kHash, 3); }, {"2 stages"});
  // A stage file restores only into its own stage.
  expect_checkpoint_error([&] { read_stage_checkpoint(folder, 2, *first.net, first.optimizer, at::kCPU); },
                          {"stage_2.pt"});

  manifest.stages.pop_back();
  write_manifest(folder, manifest);
  expect_checkpoint_error([&] { read_manifest(folder, kHash, 2); }, {"one file per stage"});
}

// A stage written by another node into a checkpoint_dir that is not shared is not here: no
// manifest (a resume would find a "complete" checkpoint it cannot read), and the error says why.
// A checkpoint that cannot be written is the system's failure, with its reason, not a refused
// checkpoint (CheckpointError, exit 2 "see --help"): CheckpointWriteError, exit 1.
TEST(CheckpointTest, AFailedWriteIsAWriteErrorNamingTheReason) {
  Trainee trainee;
  try {
    write_stage_checkpoint("/proc/no_such_folder/step_00000001", 0, *trainee.net, trainee.optimizer, at::kCPU, {1, 0, 0},
                           kHash);
    ADD_FAILURE() << "a checkpoint was written under /proc";
  } catch (const CheckpointWriteError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create checkpoint folder /proc/no_such_folder"), std::string::npos)
        << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a CheckpointWriteError: " << e.what();
  }
  testing::TempDir dir;
  Manifest manifest;
  manifest.config_hash = kHash;
  EXPECT_THROW(write_manifest(dir.path() + "/gone", manifest), CheckpointWriteError);
}

TEST(CheckpointTest, AManifestListingAStageFileThatIsNotHereIsNotWritten) {
  testing::TempDir dir;
  Trainee trainee;
  const std::string folder = checkpoint_folder(dir.path(), 3);
  Manifest manifest;
  manifest.position = {3, 0, 3};
  manifest.config_hash = kHash;
  manifest.num_stages = 2;
  manifest.world_size = 2;
  manifest.stages.push_back(
      write_stage_checkpoint(folder, 0, *trainee.net, trainee.optimizer, at::kCPU, manifest.position, kHash));
  manifest.stages.push_back({1, "stage_1.pt", 1234, 0});  // the other node's entry, its file elsewhere
  expect_checkpoint_error([&] { write_manifest(folder, manifest); },
                          {"stage 1's file", "stage_1.pt", "missing", "training.checkpoint_dir"});
  EXPECT_FALSE(std::filesystem::exists(folder + "/manifest.json"));
  EXPECT_EQ(latest_checkpoint(dir.path()), std::nullopt);
}

TEST(CheckpointTest, TruncatedStageFileIsRefused) {
  testing::TempDir dir;
  Trainee trainee;
  const std::string folder = save_complete(dir.path(), 1, trainee);
  const std::string file = folder + "/stage_0.pt";
  ASSERT_EQ(::truncate(file.c_str(), static_cast<off_t>(std::filesystem::file_size(file) - 5)), 0);
  expect_checkpoint_error([&] { read_manifest(folder, kHash, 1); }, {"truncated", file});
  // Read without the manifest's check, the damaged archive still fails as a CheckpointError.
  expect_checkpoint_error([&] { read_stage_checkpoint(folder, 0, *trainee.net, trainee.optimizer, at::kCPU); },
                          {file});
}

TEST(CheckpointTest, ForeignConfigHashIsRefused) {
  testing::TempDir dir;
  Trainee trainee;
  const std::string folder = save_complete(dir.path(), 1, trainee);
  const std::string other = config_hash("model: other\n");
  expect_checkpoint_error([&] { read_manifest(folder, other, 1); }, {"different configuration", kHash, other});
}

// With the configuration kept in the manifest, a refused resume names what differs.
TEST(CheckpointTest, ForeignConfigNamesTheFieldsThatDiffer) {
  testing::TempDir dir;
  Trainee trainee;
  PipelineConfig theirs;
  theirs.training.learning_rate = 0.002;
  PipelineConfig ours = theirs;
  ours.training.learning_rate = 0.003;
  ours.parallel.schedule = "zb_h1";
  const std::string folder = save_complete(dir.path(), 1, trainee, theirs.to_yaml());
  EXPECT_EQ(read_manifest(folder, kHash, 1).config_yaml, theirs.to_yaml());
  expect_checkpoint_error([&] { read_manifest(folder, config_hash(ours.to_yaml()), 1, ours.to_yaml()); },
                          {"different configuration", "training.learning_rate: 0.002 vs 0.003",
                           "parallel.schedule: 1f1b vs zb_h1", "run with the checkpoint's values"});
  EXPECT_EQ(config_differences(theirs, theirs), std::vector<std::string>{});
}

TEST(CheckpointTest, MissingOrBrokenManifestAndLeftoverTmpFiles) {
  testing::TempDir dir;
  Trainee trainee;
  const std::string complete = save_complete(dir.path(), 3, trainee);
  std::ofstream(complete + "/stage_0.pt.tmp") << "left by a crash";
  // Interrupted later checkpoints: stage files without a manifest, or a manifest never renamed.
  const std::string interrupted = checkpoint_folder(dir.path(), 5);
  write_stage_checkpoint(interrupted, 0, *trainee.net, trainee.optimizer, at::kCPU, {5, 0, 5}, kHash);
  const std::string unrenamed = checkpoint_folder(dir.path(), 6);
  std::filesystem::create_directories(unrenamed);
  std::ofstream(unrenamed + "/manifest.json.tmp") << "{";

  EXPECT_EQ(latest_checkpoint(dir.path()), complete);
  EXPECT_EQ(read_manifest(complete, kHash, 1).position.step, 3);
  expect_checkpoint_error([&] { read_manifest(interrupted, kHash, 1); }, {interrupted + "/manifest.json"});

  std::ofstream(interrupted + "/manifest.json") << "{ not json";
  expect_checkpoint_error([&] { read_manifest(interrupted, kHash, 1); }, {"manifest.json", "parse"});
  EXPECT_FALSE(latest_checkpoint(dir.path() + "/nothing_here").has_value());
}

TEST(CheckpointTest, LatestIsTheHighestCompleteStepAndPruneKeepsTheNewest) {
  testing::TempDir dir;
  Trainee trainee;
  for (int64_t step : {2, 4, 8, 6}) save_complete(dir.path(), step, trainee);
  // Incomplete folders: one older than everything, one newer (perhaps still being written).
  write_stage_checkpoint(checkpoint_folder(dir.path(), 1), 0, *trainee.net, trainee.optimizer, at::kCPU, {}, kHash);
  write_stage_checkpoint(checkpoint_folder(dir.path(), 10), 0, *trainee.net, trainee.optimizer, at::kCPU, {}, kHash);
  std::filesystem::create_directories(dir.path() + "/notes");
  EXPECT_EQ(latest_checkpoint(dir.path()), checkpoint_folder(dir.path(), 8));

  prune_checkpoints(dir.path(), 0, kHash);
  EXPECT_TRUE(std::filesystem::exists(checkpoint_folder(dir.path(), 1)));
  prune_checkpoints(dir.path(), 2, kHash);
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) left.push_back(entry.path().filename());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"notes", "step_00000006", "step_00000008", "step_00000010"}));
  EXPECT_EQ(latest_checkpoint(dir.path()), checkpoint_folder(dir.path(), 8));
  prune_checkpoints(dir.path(), 5, kHash);  // fewer complete ones than asked to keep: nothing goes
  EXPECT_TRUE(std::filesystem::exists(checkpoint_folder(dir.path(), 6)));
  // Rewriting a stage file of a complete folder makes it incomplete until its manifest is rewritten.
  write_stage_checkpoint(checkpoint_folder(dir.path(), 8), 0, *trainee.net, trainee.optimizer, at::kCPU, {}, kHash);
  EXPECT_EQ(latest_checkpoint(dir.path()), checkpoint_folder(dir.path(), 6));
}

// A folder holding an earlier run's checkpoints (another configuration): pruning keeps this run's
// newest and never deletes theirs. It used to count theirs too, and deleted each checkpoint a
// shorter new run had just written.
TEST(CheckpointTest, PruneKeepsOnlyThisConfigurationsNewestAndNeverAnotherRuns) {
  testing::TempDir dir;
  Trainee trainee;
  const std::string other = "0badc0de";
  for (int64_t step : {4, 6}) save_complete(dir.path(), step, trainee, {}, other);
  save_complete(dir.path(), 2, trainee);
  EXPECT_EQ(foreign_checkpoints(dir.path(), kHash),
            (std::vector<std::string>{checkpoint_folder(dir.path(), 6), checkpoint_folder(dir.path(), 4)}));
  EXPECT_TRUE(foreign_checkpoints(dir.path(), other).size() == 1u);
  prune_checkpoints(dir.path(), 2, kHash);
  EXPECT_TRUE(std::filesystem::exists(checkpoint_folder(dir.path(), 2))) << "this run's newest was deleted";
  save_complete(dir.path(), 3, trainee);
  save_complete(dir.path(), 5, trainee);
  prune_checkpoints(dir.path(), 2, kHash);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_folder(dir.path(), 2)));
  for (int64_t step : {3, 4, 5, 6}) EXPECT_TRUE(std::filesystem::exists(checkpoint_folder(dir.path(), step))) << step;
}

TEST(CheckpointTest, ShapeMismatchOnRestoreNamesTheParameterAndChangesNothing) {
  testing::TempDir dir;
  Trainee saved(8);
  const std::string folder = save_complete(dir.path(), 1, saved);
  Trainee narrower(6);
  const at::Tensor before = narrower.net->named_parameters()["fc2.bias"].clone();
  expect_checkpoint_error([&] { read_stage_checkpoint(folder, 0, *narrower.net, narrower.optimizer, at::kCPU); },
                          {"fc1.weight", "[6, 4]", "[8, 4]"});
  // fc2.bias has the same shape in both: the refused restore did not copy it either.
  EXPECT_TRUE(at::equal(narrower.net->named_parameters()["fc2.bias"], before));
}

}  // namespace
}  // namespace gpipe
