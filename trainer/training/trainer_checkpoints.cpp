// PipelineTrainer's checkpoints: each process writes its stages' files, rank 0 the manifest last;
// resuming reads the manifest rank 0 picked and restores this process's stages (checkpoint.h).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/data/text_data.h"
#include "trainer/distributed/distributed.h"
#include "trainer/log/engine_log.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/training/lr_schedule.h"
#include "trainer/training/trainer.h"
#include "trainer_internal.h"

namespace gpipe {

std::string PipelineTrainer::checkpoint_root() const {
  const auto& t = config_.training;
  return t.checkpoint_dir.empty() ? (std::filesystem::path(t.output_dir) / "checkpoints").string() : t.checkpoint_dir;
}

std::string PipelineTrainer::checkpoint_config_hash() const { return config_hash(checkpoint_config_yaml()); }

std::string PipelineTrainer::checkpoint_config_yaml() const {
  PipelineConfig trajectory = config_;
  trajectory.training.output_dir = "-";
  trajectory.training.checkpoint_dir.clear();
  // Under asp with windows of several steps, a window also ends at each checkpoint and around
  // the profiled step: there they shape what is trained, and a resume with others would train
  // otherwise without a word. Elsewhere they only say when to save and profile.
  if (schedule_.sync_mode != SyncMode::kAsp || config_.parallel.asp_window_steps == 1) {
    trajectory.training.checkpoint_interval = 0;
    trajectory.training.profile_iteration = 0;
  }
  trajectory.training.keep_checkpoints = 0;
  trajectory.training.log_interval = 1;
  trajectory.training.exit_after_profile = false;
  // How long to train may change on resume (to train longer): the learning-rate schedule then
  // follows this run's total (load_checkpoint() says so in the log).
  trajectory.training.max_steps = -1;
  trajectory.training.epochs = 1;
  trajectory.parallel.peer_timeout_s = 1;
  // Replicas average their gradients at the same global batch and micro-batches: a run with
  // data_parallel_size 2 follows the same trajectory as one without, and may resume it.
  trajectory.parallel.data_parallel_size = 1;
  trajectory.parallel.dp_bucket_mb = 1;
  // Where ranks run and how their kernels and messages are scheduled is the process layout, not
  // the trajectory: a checkpoint resumes under any of it (README, "Checkpoints").
  trajectory.parallel.placement.clear();
  trajectory.parallel.transport = "auto";
  trajectory.parallel.priority = "backward_first";
  trajectory.parallel.use_orion_scheduler = false;
  trajectory.parallel.publish_bubbles_gpu.clear();
  trajectory.parallel.publish_bubbles_rank = -1;
  trajectory.dataset.num_workers = 0;
  return trajectory.to_yaml();
}

void PipelineTrainer::resume_from(const std::string& folder) { resume_ = folder; }

bool PipelineTrainer::resumes_own_checkpoint() const {
  if (!resume_) return false;
  if (resume_->empty()) return true;  // the newest under checkpoint_root()
  std::error_code root_error, from_error;
  const auto root = std::filesystem::weakly_canonical(checkpoint_root(), root_error);
  const auto from = std::filesystem::weakly_canonical(*resume_, from_error);
  return !root_error && !from_error && from.parent_path() == root;
}

// Checkpoints of this configuration that this run would not continue from. A fresh run among an
// earlier run's would see its own step folders pruned in favour of theirs (prune keeps the newest
// of the configuration), and a later --resume would pick theirs: refused, naming them. A run
// resumed from an older step on purpose (rolling back past a loss spike, comparing) leaves the
// newer ones for a later --resume to prefer: a warning names them. Nothing is deleted unasked.
void PipelineTrainer::check_own_checkpoints(const std::string& root) {
  const auto own = own_checkpoints(root, checkpoint_config_hash());
  if (own.empty()) return;
  if (!resume_) {
    std::error_code ec;
    std::filesystem::remove(std::filesystem::path(root) / ".gpipe_probe", ec);
    throw ConfigError(fmt::format(
        "training.checkpoint_dir '{}' holds {} checkpoint{} of this configuration from an earlier run (newest: {}): "
        "continue it with --resume, or give this run another folder (--checkpoint-dir, or --output-dir), or remove "
        "them; a fresh run there would have its own checkpoints pruned in favour of the earlier run's",
        root, own.size(), own.size() == 1 ? "" : "s", own.front().second));
  }
  if (resume_->empty() || !resumes_own_checkpoint()) return;  // the newest, or a folder elsewhere
  std::error_code ec;
  const auto from = std::filesystem::weakly_canonical(*resume_, ec);
  std::vector<std::string> newer;
  for (const auto& [step, path] : own) {
    if (std::filesystem::weakly_canonical(path, ec) == from) break;  // newest first: the rest are older
    newer.push_back(std::filesystem::path(path).filename().string());
  }
  if (newer.empty() || newer.size() == own.size()) return;  // none newer, or resume_ is not among them
  log_warn("--resume-from {} is older than {} checkpoint{} of this run in '{}' ({}): a later --resume (the newest) "
           "would continue from those, not from this branch; to roll back for good, remove (or move) them",
           *resume_, newer.size(), newer.size() == 1 ? "" : "s", root, fmt::join(newer, ", "));
}

void PipelineTrainer::check_checkpoint_folder() {
  const std::string root = checkpoint_root();
  const std::filesystem::path probe = std::filesystem::path(root) / ".gpipe_probe";
  const bool writer = !dist_ || dist_->rank() == 0;
  std::string nonce;
  if (writer) {
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    nonce = fmt::format("{}-{}", static_cast<long>(getpid()),
                        std::chrono::steady_clock::now().time_since_epoch().count());
    std::ofstream out(probe, std::ios::trunc);
    out << nonce;
    out.close();
    if (ec || !out) {
      // Before anyone waits on the probe: the others hear it through the failure announcement.
      throw ConfigError(fmt::format("training.checkpoint_dir: cannot write checkpoints to '{}'{}: give a writable "
                                    "folder (--checkpoint-dir)", root, ec ? ": " + ec.message() : std::string()));
    }
    // One run writes a checkpoint folder at a time: two (a rerun started while the first still
    // trains, two jobs given one --checkpoint-dir) would race on the same temporary files and
    // manifests, and each prune could delete the other's folder being written.
    if (checkpoint_lock_fd_ < 0) {
      const std::string lock = (std::filesystem::path(root) / ".gpipe_lock").string();
      const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
      if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const std::string why = fd < 0 ? std::strerror(errno) : std::string();
        if (fd >= 0) ::close(fd);
        std::filesystem::remove(probe, ec);
        throw ConfigError(fd < 0 ? fmt::format("training.checkpoint_dir: cannot open {}: {}", lock, why)
                                 : fmt::format("training.checkpoint_dir '{}' is being written by another run (it holds "
                                               "{}): wait for it to end, or give this run another folder "
                                               "(--checkpoint-dir, or --output-dir)", root, lock));
      }
      checkpoint_lock_fd_ = fd;
    }
    // A run that does not continue its own checkpoints must not write among another run's: its
    // step folders would replace theirs, and --resume would later pick theirs.
    if (!resumes_own_checkpoint()) {
      const std::vector<std::string> foreign = foreign_checkpoints(root, checkpoint_config_hash());
      if (!foreign.empty()) {
        std::filesystem::remove(probe, ec);
        throw ConfigError(fmt::format(
            "training.checkpoint_dir '{}' holds {} checkpoint{} of another configuration (newest: {}): continue that run "
            "with --resume (and its configuration), or give this one another folder (--checkpoint-dir, or "
            "--output-dir), or remove them", root, foreign.size(), foreign.size() == 1 ? "" : "s", foreign.front()));
      }
    }
    check_own_checkpoints(root);
  }
  if (dist_ && dist_->world_size() > 1) {
    nonce = dist_->broadcast_from_rank0("checkpoint_probe", nonce);
    if (!writer) {
      std::ifstream in(probe);
      std::string seen;
      std::getline(in, seen);
      if (seen != nonce) {
        throw ConfigError(fmt::format(
            "training.checkpoint_dir '{}' is not the folder rank 0 writes: its probe file is {} here. Every process "
            "writes its stages' files there and rank 0 their manifest, so all must see one folder (a shared file "
            "system); give --checkpoint-dir such a folder", root, in ? "another one" : "missing"));
      }
    }
    // Every process has looked before rank 0 removes the probe.
    (void)dist_->gather_to_rank0("checkpoint_probe_seen", "ok");
  }
  if (writer) {
    std::error_code ec;
    std::filesystem::remove(probe, ec);
  }
}

void PipelineTrainer::save_checkpoint(int64_t step, int epoch, int64_t batch_index) {
  const std::string root = checkpoint_root();
  const std::string folder = checkpoint_folder(root, step);
  std::filesystem::create_directories(folder);
  const TrainingPosition position{step, epoch, batch_index};
  const std::string hash = checkpoint_config_hash();
  std::vector<StageCheckpointFile> files;
  for (size_t s = 0; s < stages_.size() && placement_.replica == 0; ++s) {  // replicas hold equal copies
    if (!stages_[s]) continue;
    files.push_back(write_stage_checkpoint(folder, static_cast<int>(s), stages_[s]->module(), *optimizers_->per_stage[s],
                                           stages_[s]->device(), position, hash));
  }
  if (dist_) {
    // Rank 0 writes the manifest only after every process has written (and fsynced) its files:
    // it waits for each rank's entries, one line per stage, through the store.
    std::string mine;
    for (const auto& f : files) mine += fmt::format("{}\t{}\t{}\t{}\n", f.stage, f.file, f.bytes, f.crc32);
    const auto all = dist_->gather_to_rank0(fmt::format("checkpoint/{}", step), mine);
    if (dist_->rank() == 0) {
      files.clear();
      for (const std::string& text : all) {
        std::istringstream lines(text);
        StageCheckpointFile f;
        while (lines >> f.stage >> f.file >> f.bytes >> f.crc32) files.push_back(f);
      }
    }
  }
  if (!dist_ || dist_->rank() == 0) {
    Manifest manifest;
    manifest.position = position;
    manifest.config_hash = hash;
    manifest.config_yaml = checkpoint_config_yaml();
    manifest.data_digest = components_.dataset->content_digest();
    manifest.data_order = kEpochOrder;
    manifest.num_stages = static_cast<int>(stages_.size());
    manifest.world_size = dist_ ? dist_->world_size() : 1;
    manifest.stages = files;
    std::sort(manifest.stages.begin(), manifest.stages.end(),
              [](const StageCheckpointFile& a, const StageCheckpointFile& b) { return a.stage < b.stage; });
    write_manifest(folder, manifest);
    prune_checkpoints(root, config_.training.keep_checkpoints, hash);
    engine_log_info(fmt::format("checkpoint of step {} written to {}", step, folder));
  }
  // Every process leaves the checkpoint together. Replica 1's processes write nothing: they ran
  // on into the next step's gradient all-reduce, which waits one peer timeout, while replica 0
  // still wrote (a slow shared filesystem). This wait goes on while rank 0 beats, and rank 0 got
  // here only after every process's files were written (its gather waits the same way).
  if (dist_) dist_->broadcast_from_rank0(fmt::format("checkpoint/{}/written", step), folder);
}
std::tuple<int64_t, int, int64_t> PipelineTrainer::load_checkpoint() {
  std::string folder = resume_.value_or("");
  if (folder.empty()) {
    // Rank 0 picks, so that every process resumes from the same step even if a newer checkpoint
    // completes in between.
    const auto latest = latest_checkpoint(checkpoint_root());
    folder = latest.value_or("");
    if (dist_) folder = dist_->broadcast_from_rank0("resume_folder", folder);
    if (folder.empty()) {
      throw CheckpointError("--resume: no complete checkpoint under " + checkpoint_root() +
                            " (a folder step_N with a manifest.json); train without --resume, or set "
                            "training.checkpoint_dir to where the checkpoints are");
    }
  }
  const Manifest manifest =
      read_manifest(folder, checkpoint_config_hash(), static_cast<int>(stages_.size()), checkpoint_config_yaml());
  // The same configuration on other data (a file added under dataset.path, another tokenizer
  // model) would resume at a position in batches that are not the ones it trained on.
  if (const std::string here = components_.dataset->content_digest();
      !manifest.data_digest.empty() && manifest.data_digest != here) {
    throw CheckpointError(fmt::format("{} was trained on other data: {} then, {} now (the files under dataset.path or "
                                      "the tokenizer changed); resume with the data it was trained on, or train afresh "
                                      "in another folder", folder, manifest.data_digest, here));
  }
  if (manifest.data_order != kEpochOrder && (!dist_ || dist_->rank() == 0)) {
    // Not refused: the weights are right; only which samples the rest of the epoch visits differs.
    log_warn("{} was written by a build that ordered epochs otherwise ({}); this build's order is {}: the rest of "
             "epoch {} visits its samples in another order (some again, some not), later epochs are new orders",
             folder, manifest.data_order.empty() ? "seed + epoch" : manifest.data_order, kEpochOrder,
             manifest.position.epoch);
  }
  TrainingPosition position = manifest.position;
  const auto local_stages = std::count_if(stages_.begin(), stages_.end(), [](const auto& s) { return s != nullptr; });
  engine_log_info(fmt::format("loading checkpoint {} (step {}): weights and AdamW state of {} stage{} ...", folder,
                              manifest.position.step, local_stages, local_stages == 1 ? "" : "s"));
  int loaded = 0;
  for (size_t s = 0; s < stages_.size(); ++s) {
    if (!stages_[s]) continue;
    if (local_stages > 1) {
      engine_log_info(fmt::format("  stage {} ({} of {})", s, ++loaded, local_stages));
    }
    const TrainingPosition stored = read_stage_checkpoint(folder, static_cast<int>(s), stages_[s]->module(),
                                                          *optimizers_->per_stage[s], stages_[s]->device());
    if (!(stored == manifest.position)) {
      throw CheckpointError(fmt::format("{}: stage {} was saved at step {} but the manifest says step {}: the folder "
                                        "mixes two checkpoints", folder, s, stored.step, manifest.position.step));
    }
  }
  engine_log_info(fmt::format("resumed from {}: {} steps done, next batch {} of epoch {}", folder, position.step,
                              position.batch_index, position.epoch));
  const auto& t = config_.training;
  engine_log_info(fmt::format(
      "learning rate: this run trains {} steps in all (training.max_steps={}, training.epochs={}), so the "
      "warm-up + cosine schedule spans {} steps; step {} continues at lr {:.3e}{}",
      total_steps(), t.max_steps, t.epochs, total_steps(), position.step,
      learning_rate_at(position.step, total_steps(), t.learning_rate, t.warmup_steps, t.min_lr_ratio),
      position.step >= total_steps() ? " (already at or past the end: nothing left to train)" : ""));
  return {position.step, position.epoch, position.batch_index};
}

}  // namespace gpipe
