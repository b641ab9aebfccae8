// A scratch folder for a test, made with mkdtemp and removed with nftw. Not std::filesystem:
// libtorch.so exports its own copies of std::filesystem::remove_all and friends, which win
// symbol lookup in any program linked with LibTorch and crash (remove_all calls a null pointer).
#pragma once

#include <ftw.h>
#include <stdlib.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace gpipe::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/ourgpipe_test_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    nftw(path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace gpipe::test
