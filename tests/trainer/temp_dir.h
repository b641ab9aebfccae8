// Scratch folders for the trainer tests. Not std::filesystem::remove_all: libtorch.so exports its
// own copies of std::filesystem::remove_all and friends, which win symbol lookup in any program
// linked with LibTorch and crash (remove_all calls a null pointer). nftw does the recursive delete.
#pragma once

#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace gpipe::testing {

inline void remove_tree(const std::string& path) {
  nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
       FTW_DEPTH | FTW_PHYS);
}

// A fresh, empty folder path under /tmp named after `tag` and this process (not created: the
// code under test creates it); the caller removes it with remove_tree().
inline std::string fresh_temp_dir(const std::string& tag) {
  const std::string dir = "/tmp/gpipe_" + tag + "_" + std::to_string(::getpid());
  remove_tree(dir);
  return dir;
}

// A folder made with mkdtemp, removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/ourgpipe_test_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() { remove_tree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace gpipe::testing
