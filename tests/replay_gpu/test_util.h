// Helpers of the replayer's tests: run a command, a workload from text, a scratch folder.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "scheduler/workload.h"

namespace replay_gpu_test {

// stdout and stderr together; *rc is the exit status.
inline std::string run_command(const std::string& cmd, int* rc) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return "";
  std::string output;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe)) output += buf;
  const int status = pclose(pipe);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return output;
}

inline sched::Workload workload_from(const std::string& text, const std::string& name = "test.jsonl") {
  std::istringstream in(text);
  return sched::parse_workload(in, name);
}

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "replay_gpu_test.XXXXXX").string();
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~ScratchDir() {
    if (!path_.empty()) std::filesystem::remove_all(path_);
  }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

 private:
  std::string path_;
};

}  // namespace replay_gpu_test
