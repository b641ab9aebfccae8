// Checkpoint folders: atomic file commits, the manifest that makes a folder complete, finding the
// newest complete folder and pruning old ones. The stage archives are in checkpoint_stage.cpp.
#include "trainer/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <ftw.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint_files.h"
#include "trainer/config/config.h"

namespace gpipe::checkpoint_files {
namespace {

std::string parent_folder(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// fsync of a file or a folder: a rename is durable only once the folder holding it is synced.
void fsync_path(const std::string& path, bool is_folder) {
  const int fd = ::open(path.c_str(), O_RDONLY | (is_folder ? O_DIRECTORY : 0));
  if (fd < 0) fail_write("cannot open " + path + " to sync it: " + errno_text());
  const int rc = ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  if (rc != 0) fail_write("cannot sync " + path + ": " + std::strerror(saved_errno));
}

}  // namespace

void commit_tmp_file(const std::string& tmp_path, const std::string& final_path) {
  fsync_path(tmp_path, false);
  if (std::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    fail_write("cannot rename " + tmp_path + " to " + final_path + ": " + errno_text());
  }
  fsync_path(parent_folder(final_path), true);
}

void remove_manifest(const std::string& folder) {
  const std::string manifest = folder + "/" + kManifestName;
  if (std::remove(manifest.c_str()) != 0 && errno != ENOENT) fail_write("cannot delete " + manifest + ": " + errno_text());
}

FileDigest digest_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open " + path + " to check it");
  FileDigest digest;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<uInt>(in.gcount());
    if (got == 0) break;
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), got);
    digest.bytes += got;
  }
  if (in.bad()) fail("cannot read " + path + " to check it");
  digest.crc32 = static_cast<uint32_t>(crc);
  return digest;
}

[[noreturn]] void fail(const std::string& message) { throw CheckpointError(message); }
[[noreturn]] void fail_write(const std::string& message) { throw CheckpointWriteError(message); }

std::string errno_text() { return std::strerror(errno); }

}  // namespace gpipe::checkpoint_files

namespace gpipe {
using namespace checkpoint_files;
namespace {

constexpr const char* kFolderPrefix = "step_";

std::string hex32(uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof text, "%08" PRIx32, value);
  return text;
}

// The step of a folder named step_<digits>, or nullopt for anything else.
std::optional<int64_t> step_of_folder(const std::filesystem::directory_entry& entry) {
  const std::string name = entry.path().filename().string();
  const std::string prefix = kFolderPrefix;
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  std::error_code error;
  if (!entry.is_directory(error)) return std::nullopt;
  return std::stoll(digits);
}

struct StepFolder {
  int64_t step;
  std::string path;
  bool complete;  // has a manifest
};

// Every step_<N> folder under root, newest first.
std::vector<StepFolder> list_step_folders(const std::string& root) {
  std::vector<StepFolder> folders;
  std::error_code error;
  std::filesystem::directory_iterator it(root, error);
  if (error) return folders;  // no root yet: no checkpoints
  for (const auto& entry : it) {
    if (auto step = step_of_folder(entry)) {
      const std::string path = entry.path().string();
      folders.push_back({*step, path, std::filesystem::exists(path + "/" + kManifestName, error)});
    }
  }
  std::sort(folders.begin(), folders.end(), [](const StepFolder& a, const StepFolder& b) { return a.step > b.step; });
  return folders;
}

// Not std::filesystem::remove_all: libtorch.so exports broken copies of it that win symbol lookup.
void remove_tree(const std::string& path) {
  const int rc = ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
  if (rc != 0) fail_write("cannot delete old checkpoint " + path + ": " + errno_text());
}

}  // namespace

std::string checkpoint_folder(const std::string& root, int64_t step) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%08" PRId64, step);
  return root + "/" + kFolderPrefix + digits;
}

std::string config_hash(const std::string& text) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (size_t offset = 0; offset < text.size(); offset += 1 << 30) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(text.size() - offset, size_t{1} << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(text.data() + offset), chunk);
  }
  return hex32(static_cast<uint32_t>(crc));
}

namespace {
// "; the checkpoint's vs this run's: training.learning_rate: 0.002 vs 0.003, ..." when both
// configurations are known and readable, else nothing (the hashes alone).
std::string describe_differences(const std::string& theirs, const std::string& ours) {
  if (theirs.empty() || ours.empty()) return "";
  std::vector<std::string> diffs;
  try {
    diffs = config_differences(PipelineConfig::from_yaml_string(theirs, "the checkpoint's configuration"),
                               PipelineConfig::from_yaml_string(ours, "this run's configuration"));
  } catch (const std::exception&) {
    return "";  // a configuration this build cannot read (an older schema): the hashes say enough
  }
  if (diffs.empty()) return "";
  constexpr size_t kShown = 6;
  std::string text = "; the checkpoint's vs this run's: ";
  for (size_t i = 0; i < std::min(kShown, diffs.size()); ++i) text += (i ? ", " : "") + diffs[i];
  if (diffs.size() > kShown) text += " and " + std::to_string(diffs.size() - kShown) + " more";
  return text;
}
}  // namespace

void write_manifest(const std::string& folder, const Manifest& manifest) {
  // Each process writes its own stages; the manifest is written last, by one process. A stage
  // file that is not here (or not whole) would make a manifest that no resume can use: on a
  // cluster this is a checkpoint folder each node has its own copy of.
  for (const auto& s : manifest.stages) {
    const std::filesystem::path file = std::filesystem::path(folder) / s.file;
    std::error_code ec;
    const auto size = std::filesystem::file_size(file, ec);
    if (ec || size != s.bytes) {
      const std::string stage = std::to_string(s.stage);
      fail("stage " + stage + "'s file " + file.string() + " (" + std::to_string(s.bytes) +
           " bytes, written by the process that runs stage " + stage + ") is " +
           (ec ? std::string("missing") : std::to_string(size) + " bytes") +
           " here: training.checkpoint_dir must be one folder every process sees (a filesystem shared by all "
           "nodes: NFS, Lustre, GPFS), not a node-local path; the manifest was not written");
    }
  }
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : manifest.stages) {
    stages.push_back({{"stage", s.stage}, {"file", s.file}, {"bytes", s.bytes}, {"crc32", hex32(s.crc32)}});
  }
  const nlohmann::json json = {
      {"format_version", manifest.format_version},
      {"position",
       {{"step", manifest.position.step},
        {"epoch", manifest.position.epoch},
        {"batch_index", manifest.position.batch_index}}},
      {"config_hash", manifest.config_hash},
      {"config", manifest.config_yaml},
      {"data_digest", manifest.data_digest},
      {"data_order", manifest.data_order},
      {"num_stages", manifest.num_stages},
      {"world_size", manifest.world_size},
      {"stages", stages},
  };
  const std::string path = folder + "/" + kManifestName;
  const std::string tmp_path = path + ".tmp";
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    out << json.dump(2) << "\n";
    out.close();
    if (!out) fail_write("cannot write " + tmp_path + ": " + errno_text());
  }
  commit_tmp_file(tmp_path, path);
  // The step folder's own entry in the checkpoint root: synced before anything older is pruned,
  // so a power loss cannot leave neither the new checkpoint nor the old ones.
  fsync_path(parent_folder(folder), true);
}

Manifest read_manifest(const std::string& folder, const std::string& expected_config_hash, int expected_num_stages,
                       const std::string& expected_config_yaml) {
  const std::string path = folder + "/" + kManifestName;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("no checkpoint manifest " + path + " (missing, or the checkpoint was interrupted)");
  Manifest manifest;
  try {
    const nlohmann::json json = nlohmann::json::parse(in);
    manifest.format_version = json.at("format_version").get<int>();
    const auto& position = json.at("position");
    manifest.position.step = position.at("step").get<int64_t>();
    manifest.position.epoch = position.at("epoch").get<int>();
    manifest.position.batch_index = position.at("batch_index").get<int64_t>();
    manifest.config_hash = json.at("config_hash").get<std::string>();
    manifest.config_yaml = json.value("config", std::string());
    manifest.data_digest = json.value("data_digest", std::string());
    manifest.data_order = json.value("data_order", std::string());
    manifest.num_stages = json.at("num_stages").get<int>();
    manifest.world_size = json.at("world_size").get<int>();
    for (const auto& s : json.at("stages")) {
      manifest.stages.push_back({s.at("stage").get<int>(), s.at("file").get<std::string>(),
                                 s.at("bytes").get<uint64_t>(),
                                 static_cast<uint32_t>(std::stoul(s.at("crc32").get<std::string>(), nullptr, 16))});
    }
  } catch (const std::exception& e) {  // nlohmann::json::exception, std::stoul's
    fail("cannot parse checkpoint manifest " + path + ": " + e.what());
  }
  if (manifest.format_version != kFormatVersion) {
    fail("checkpoint manifest " + path + " has format version " + std::to_string(manifest.format_version) +
         " (this build reads " + std::to_string(kFormatVersion) + ")");
  }
  if (manifest.config_hash != expected_config_hash) {
    fail("checkpoint " + folder + " was written by a different configuration (hash " + manifest.config_hash +
         " vs " + expected_config_hash + ")" + describe_differences(manifest.config_yaml, expected_config_yaml) +
         ": refuse to resume from it (run with the checkpoint's values, or train from scratch)");
  }
  if (manifest.num_stages != expected_num_stages) {
    fail("checkpoint " + folder + " has " + std::to_string(manifest.num_stages) + " stages, the run has " +
         std::to_string(expected_num_stages));
  }
  std::sort(manifest.stages.begin(), manifest.stages.end(),
            [](const StageCheckpointFile& a, const StageCheckpointFile& b) { return a.stage < b.stage; });
  for (size_t i = 0; i < manifest.stages.size() || static_cast<int>(i) < manifest.num_stages; ++i) {
    if (i >= manifest.stages.size() || static_cast<int>(i) >= manifest.num_stages ||
        manifest.stages[i].stage != static_cast<int>(i)) {
      fail("checkpoint manifest " + path + " does not list exactly one file per stage 0.." +
           std::to_string(manifest.num_stages - 1));
    }
  }
  for (const auto& s : manifest.stages) {
    if (s.file.empty() || s.file.find('/') != std::string::npos) fail("bad stage file name in " + path + ": " + s.file);
    const std::string file = folder + "/" + s.file;
    if (!std::filesystem::exists(file)) fail("missing stage checkpoint " + file + " listed in " + path);
    const FileDigest digest = digest_file(file);
    if (digest.bytes != s.bytes || digest.crc32 != s.crc32) {
      fail("truncated or modified: " + file + " (" + std::to_string(digest.bytes) + " bytes, crc32 " +
           hex32(digest.crc32) + "; the manifest says " + std::to_string(s.bytes) + " bytes, crc32 " + hex32(s.crc32) +
           ")");
    }
  }
  return manifest;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  for (const auto& folder : list_step_folders(root)) {
    if (folder.complete) return folder.path;
  }
  return std::nullopt;
}

namespace {
// The config hash a complete folder's manifest names; nullopt when it cannot be read.
std::optional<std::string> manifest_config_hash(const std::string& folder) {
  std::ifstream in(folder + "/" + kManifestName, std::ios::binary);
  if (!in) return std::nullopt;
  try {
    return nlohmann::json::parse(in).at("config_hash").get<std::string>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}
}  // namespace

std::vector<std::string> foreign_checkpoints(const std::string& root, const std::string& config_hash) {
  std::vector<std::string> out;
  for (const auto& folder : list_step_folders(root)) {
    if (folder.complete && manifest_config_hash(folder.path) != config_hash) out.push_back(folder.path);
  }
  return out;
}

std::vector<std::pair<int64_t, std::string>> own_checkpoints(const std::string& root, const std::string& config_hash) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& folder : list_step_folders(root)) {
    if (folder.complete && manifest_config_hash(folder.path) == config_hash) out.emplace_back(folder.step, folder.path);
  }
  return out;
}

void prune_checkpoints(const std::string& root, int keep, const std::string& config_hash) {
  if (keep <= 0) return;
  std::vector<StepFolder> folders = list_step_folders(root);
  // Another run's checkpoints are never this run's to delete.
  std::erase_if(folders, [&](const StepFolder& f) { return f.complete && manifest_config_hash(f.path) != config_hash; });
  int complete_seen = 0;
  std::optional<int64_t> oldest_kept;
  for (const auto& folder : folders) {
    if (folder.complete && ++complete_seen == keep) {
      oldest_kept = folder.step;
      break;
    }
  }
  if (!oldest_kept) return;
  for (const auto& folder : folders) {
    if (folder.step >= *oldest_kept) continue;
    // The manifest goes first: a folder half deleted by a crash is then never taken as complete.
    remove_manifest(folder.path);
    remove_tree(folder.path);
  }
  fsync_path(root, true);
}

}  // namespace gpipe
