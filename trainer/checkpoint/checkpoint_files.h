// What the checkpoint folders (checkpoint.cpp) and the stage archives (checkpoint_stage.cpp) share:
// the format constants, atomic commits of a written <file>.tmp, and file digests.
#pragma once

#include <cstdint>
#include <string>

namespace gpipe::checkpoint_files {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kManifestName = "manifest.json";

// Throws CheckpointError(message): a checkpoint that must not be used.
[[noreturn]] void fail(const std::string& message);
// Throws CheckpointWriteError(message): writing, syncing, renaming or deleting failed.
[[noreturn]] void fail_write(const std::string& message);
// strerror(errno).
std::string errno_text();

// Makes a fully written <final>.tmp the final file (fsync, rename, fsync of the folder): a reader
// sees either the old file or the whole new one, also after a power loss.
void commit_tmp_file(const std::string& tmp_path, const std::string& final_path);

// Deletes <folder>/manifest.json if there is one: the folder is incomplete from then on.
void remove_manifest(const std::string& folder);

struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;  // zlib's
};
FileDigest digest_file(const std::string& path);

}  // namespace gpipe::checkpoint_files
