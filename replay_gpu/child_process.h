// Runs this executable again as a child process with a changed environment (LD_PRELOAD of the
// shim, ORION_POLICY, ...): the shim reads its settings once when it loads, so every policy needs
// a process of its own.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace replay_gpu {

// Path of the running executable (/proc/self/exe).
std::string self_executable();

// Runs argv[0] with argv, the parent's environment changed by `env` (a value sets the variable,
// nullopt removes it); its stdout and stderr are the parent's. Returns its exit status (128 + N
// when killed by signal N). Throws std::runtime_error when it cannot be started.
int run_child(const std::vector<std::string>& argv, const std::map<std::string, std::optional<std::string>>& env);

}  // namespace replay_gpu
