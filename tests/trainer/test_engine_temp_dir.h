// Temporary folders for the engine tests. std::filesystem::remove_all must not be used in
// programs linked with this LibTorch wheel: libtorch.so exports its own std::filesystem symbols
// and its remove_all crashes (null call). nftw does the recursive delete instead.
#pragma once

#include <ftw.h>
#include <stdio.h>
#include <unistd.h>

#include <string>

namespace gpipe::testing {

inline void remove_tree(const std::string& path) {
  nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
       FTW_DEPTH | FTW_PHYS);
}

// A fresh, empty folder under /tmp named after `tag` and this process.
inline std::string fresh_temp_dir(const std::string& tag) {
  const std::string dir = "/tmp/gpipe_" + tag + "_" + std::to_string(::getpid());
  remove_tree(dir);
  return dir;
}

}  // namespace gpipe::testing
