// Stage archives: one LibTorch OutputArchive per stage with its parameters, buffers, optimizer
// state, generator states and position; restored in place with every tensor checked first.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "checkpoint_files.h"
#include "trainer/checkpoint/checkpoint.h"

namespace gpipe {
using namespace checkpoint_files;
namespace {

std::string stage_file_name(int stage) { return "stage_" + std::to_string(stage) + ".pt"; }

void write_int(torch::serialize::OutputArchive& archive, const std::string& key, int64_t value) {
  archive.write(key, c10::IValue(value));
}

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  archive.read(key, value);
  return value.toInt();
}

// Tensors under index keys with their names alongside: archive keys become TorchScript attribute
// names, and index keys stay plain identifiers whatever dots the nested module names hold.
void write_named_tensors(torch::serialize::OutputArchive& archive, const std::string& key,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors, bool is_buffer) {
  torch::serialize::OutputArchive nested(archive.compilation_unit());
  c10::List<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    names.push_back(tensors[i].first);
    nested.write("t" + std::to_string(i), tensors[i].second.detach(), is_buffer);
  }
  nested.write("names", c10::IValue(names));
  archive.write(key, nested);
}

std::map<std::string, at::Tensor> read_named_tensors(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::serialize::InputArchive nested;
  archive.read(key, nested);
  c10::IValue names;
  nested.read("names", names);
  std::map<std::string, at::Tensor> tensors;
  const c10::List<c10::IValue> list = names.toList();
  for (size_t i = 0; i < list.size(); ++i) {
    at::Tensor tensor;
    nested.read("t" + std::to_string(i), tensor);
    tensors[list.get(i).toStringRef()] = tensor;
  }
  return tensors;
}

template <typename Items>
std::vector<std::pair<std::string, at::Tensor>> to_pairs(const Items& items) {
  std::vector<std::pair<std::string, at::Tensor>> pairs;
  for (const auto& item : items) {
    // Modules may register undefined placeholders (an optional bias, untracked running stats).
    if (item.value().defined()) pairs.emplace_back(item.key(), item.value());
  }
  return pairs;
}

std::string shape_text(const at::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.sizes() << " " << tensor.scalar_type();
  return text.str();
}

// Checks every tensor of the module against the checkpoint before copying any of them, so a
// refused restore leaves the module as it was.
void restore_tensors(const std::vector<std::pair<std::string, at::Tensor>>& targets,
                     const std::map<std::string, at::Tensor>& saved, const std::string& kind, const std::string& file) {
  for (const auto& [name, target] : targets) {
    auto it = saved.find(name);
    if (it == saved.end()) fail(file + " has no " + kind + " '" + name + "'");
    if (it->second.sizes() != target.sizes() || it->second.scalar_type() != target.scalar_type()) {
      fail(kind + " '" + name + "' in " + file + " is " + shape_text(it->second) + " but the model's is " +
           shape_text(target));
    }
  }
  if (saved.size() != targets.size()) {
    for (const auto& [name, tensor] : saved) {
      const bool known = std::any_of(targets.begin(), targets.end(), [&](const auto& t) { return t.first == name; });
      if (!known) fail(file + " has a " + kind + " '" + name + "' that the model does not");
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) target.copy_(saved.at(name));
}

// Generators are handles to a shared implementation: copies lock and change the same state.
at::Tensor get_generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state.to(at::kCPU));
}

#ifdef OURGPIPE_HAVE_TORCH_CUDA
const at::Generator& cuda_generator(c10::Device device) {
  return at::cuda::detail::getDefaultCUDAGenerator(device.has_index() ? device.index() : -1);
}
#endif

}  // namespace

StageCheckpointFile write_stage_checkpoint(const std::string& folder, int stage, torch::nn::Module& module,
                                           torch::optim::Optimizer& optimizer, c10::Device device,
                                           const TrainingPosition& position, const std::string& config_hash) {
  std::error_code error;
  std::filesystem::create_directories(folder, error);
  if (error) fail_write("cannot create checkpoint folder " + folder + ": " + error.message());
  // Rewriting a folder (a rerun reaching the same step) invalidates its old manifest until the new one.
  remove_manifest(folder);
  const std::string name = stage_file_name(stage);
  const std::string path = folder + "/" + name;
  const std::string tmp_path = path + ".tmp";
  try {
    torch::serialize::OutputArchive archive;
    write_int(archive, "format_version", kFormatVersion);
    write_int(archive, "stage", stage);
    write_int(archive, "step", position.step);
    write_int(archive, "epoch", position.epoch);
    write_int(archive, "batch_index", position.batch_index);
    archive.write("config_hash", c10::IValue(config_hash));
    write_named_tensors(archive, "parameters", to_pairs(module.named_parameters()), false);
    write_named_tensors(archive, "buffers", to_pairs(module.named_buffers()), true);
    torch::serialize::OutputArchive optimizer_archive(archive.compilation_unit());
    optimizer.save(optimizer_archive);
    archive.write("optimizer", optimizer_archive);
    archive.write("cpu_rng_state", get_generator_state(at::detail::getDefaultCPUGenerator()), true);
#ifdef OURGPIPE_HAVE_TORCH_CUDA
    if (device.is_cuda()) archive.write("cuda_rng_state", get_generator_state(cuda_generator(device)), true);
#endif
    archive.save_to(tmp_path);
#ifndef OURGPIPE_HAVE_TORCH_CUDA
    static_cast<void>(device);  // only CUDA devices have a generator of their own
#endif
  } catch (const c10::Error& e) {
    fail_write("cannot write checkpoint " + tmp_path + ": " + e.what_without_backtrace());
  }
  commit_tmp_file(tmp_path, path);
  const FileDigest digest = digest_file(path);
  return {stage, name, digest.bytes, digest.crc32};
}

TrainingPosition read_stage_checkpoint(const std::string& folder, int stage, torch::nn::Module& module,
                                       torch::optim::Optimizer& optimizer, c10::Device device) {
  const std::string path = folder + "/" + stage_file_name(stage);
  if (!std::filesystem::exists(path)) fail("missing stage checkpoint: " + path);
  TrainingPosition position;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, device);
    if (read_int(archive, "format_version") != kFormatVersion) fail("unknown checkpoint format in " + path);
    if (read_int(archive, "stage") != stage) fail(path + " holds a different stage");
    position.step = read_int(archive, "step");
    position.epoch = static_cast<int>(read_int(archive, "epoch"));
    position.batch_index = read_int(archive, "batch_index");
    restore_tensors(to_pairs(module.named_parameters()), read_named_tensors(archive, "parameters"), "parameter", path);
    restore_tensors(to_pairs(module.named_buffers()), read_named_tensors(archive, "buffers"), "buffer", path);
    torch::serialize::InputArchive optimizer_archive;
    archive.read("optimizer", optimizer_archive);
    optimizer.load(optimizer_archive);
    at::Tensor cpu_state;
    archive.read("cpu_rng_state", cpu_state, true);
    set_generator_state(at::detail::getDefaultCPUGenerator(), cpu_state);
#ifdef OURGPIPE_HAVE_TORCH_CUDA
    at::Tensor cuda_state;
    // A checkpoint written by a CPU run has no CUDA state: the CUDA generator keeps its seed.
    if (device.is_cuda() && archive.try_read("cuda_rng_state", cuda_state, true)) {
      set_generator_state(cuda_generator(device), cuda_state);
    }
#endif
  } catch (const c10::Error& e) {
    fail("cannot restore checkpoint " + path + ": " + e.what_without_backtrace());
  }
  return position;
}

}  // namespace gpipe
