// Per-stage checkpoints of the pipeline trainer. Each process writes the stages it owns, one file
// per stage (parameters, buffers, optimizer state, RNG states, position); one process then writes
// the folder's manifest.json, which lists every stage file with its size and crc32. Every file goes
// through <file>.tmp + fsync + rename, and the manifest comes last, so a folder without a manifest
// is an interrupted checkpoint: it is never resumed from.
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpipe {

// A checkpoint that must not be used (missing, damaged, foreign, mismatched). The runner exits 2.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A checkpoint that could not be written (disk full, a folder gone, a failed sync), with the
// system's reason: not the user's input, so the runner exits 1 (not 2, "see --help").
struct CheckpointWriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where training resumes: `step` optimizer steps are done; the next batch is (epoch, batch_index).
struct TrainingPosition {
  int64_t step = 0;
  int epoch = 0;
  int64_t batch_index = 0;
  bool operator==(const TrainingPosition&) const = default;
};

struct StageCheckpointFile {
  int stage = 0;
  std::string file;  // relative to the checkpoint folder
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct Manifest {
  int format_version = 1;
  TrainingPosition position;
  std::string config_hash;  // hex; a different run's checkpoint is "foreign"
  // The configuration the hash is of (PipelineConfig::to_yaml), so that a refused resume can name
  // the fields that differ; empty in checkpoints written before it was kept.
  std::string config_yaml;
  // The training data's digest when it was written (DatasetInterface::content_digest: token count
  // and CRC): the config names dataset.path, not what is in it. Empty in older checkpoints.
  std::string data_digest;
  // How epochs order the samples (trainer/data/text_data.h kEpochOrder); empty in older checkpoints.
  std::string data_order;
  int num_stages = 0;
  int world_size = 1;
  std::vector<StageCheckpointFile> stages;  // exactly one per stage 0..num_stages-1 when complete
};

// <root>/step_<8-digit step>: one folder per checkpoint.
std::string checkpoint_folder(const std::string& root, int64_t step);

// Writes <folder>/stage_<stage>.pt atomically (creating the folder): the module's named parameters
// and buffers, the optimizer state, the CPU generator state (and `device`'s generator state when it
// is CUDA), the position and the config hash. Returns the entry for the manifest.
StageCheckpointFile write_stage_checkpoint(const std::string& folder, int stage, torch::nn::Module& module,
                                           torch::optim::Optimizer& optimizer, c10::Device device,
                                           const TrainingPosition& position, const std::string& config_hash);

// Writes <folder>/manifest.json atomically; call once every stage file exists. Throws
// CheckpointError (and writes nothing) when a listed stage file is missing or not of its recorded
// size: another node's file in a checkpoint_dir that is not shared.
void write_manifest(const std::string& folder, const Manifest& manifest);

// Reads <folder>/manifest.json and checks it: parsable, complete, every stage file with its recorded
// size and crc32, the expected config hash and stage count. Throws CheckpointError otherwise; for
// a different configuration, naming the fields that differ when both YAMLs are known
// (`expected_config_yaml`: what the hash is of).
Manifest read_manifest(const std::string& folder, const std::string& expected_config_hash, int expected_num_stages,
                       const std::string& expected_config_yaml = {});

// The newest complete checkpoint folder under root (highest step with a manifest.json), or nullopt.
std::optional<std::string> latest_checkpoint(const std::string& root);

// Restores stage `stage` from a folder read_manifest() accepted: parameters and buffers copied in
// place (same shapes and dtypes), optimizer state, CPU generator state (and CUDA's for CUDA
// devices). Returns the position stored. Throws CheckpointError naming the file or tensor.
TrainingPosition read_stage_checkpoint(const std::string& folder, int stage, torch::nn::Module& module,
                                       torch::optim::Optimizer& optimizer, c10::Device device);

// Deletes this configuration's checkpoint folders under root (manifest hash `config_hash`) older
// than its newest `keep` complete ones (keep <= 0: keeps all), and incomplete folders older than
// those. Folders newer than those (possibly still being written) and other runs' stay.
void prune_checkpoints(const std::string& root, int keep, const std::string& config_hash);

// The complete checkpoint folders under root that another configuration wrote (their manifest's
// hash is not `config_hash`, or cannot be read), newest first.
std::vector<std::string> foreign_checkpoints(const std::string& root, const std::string& config_hash);

// The complete checkpoint folders under root that this configuration wrote (manifest hash
// `config_hash`), newest first, with their steps.
std::vector<std::pair<int64_t, std::string>> own_checkpoints(const std::string& root, const std::string& config_hash);

// Stable hash of a config text: zlib crc32 of its bytes, 8 hex digits.
std::string config_hash(const std::string& text);

}  // namespace gpipe
