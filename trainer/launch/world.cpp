// world_from_environment(): torch.distributed's env:// variables (torchrun, the built-in launcher)
// or SLURM's srun variables, validated, into a WorldInfo.
#include "trainer/launch/world.h"

#include <unistd.h>

#include <charconv>
#include <optional>
#include <string_view>
#include <vector>

namespace gpipe {
namespace {

constexpr const char* kLaunchHint =
    "launch with torchrun --no-python --nproc_per_node=N gpipe_runner ... or gpipe_runner --nproc-per-node N";

// An empty value counts as unset: `export MASTER_ADDR=` is how shells "unset" in job scripts.
std::optional<std::string> lookup(const GetEnv& getenv, const char* name) {
  const char* value = getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// The whole of `text` as an integer of type T, or nullopt.
template <typename T = int>
std::optional<T> parse_int(std::string_view text) {
  T value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

int int_at_least(const std::string& name, const std::string& text, int minimum) {
  const std::optional<int> value = parse_int(text);
  if (!value) throw WorldError(name + "='" + text + "' is not an integer");
  if (*value < minimum) throw WorldError(name + "='" + text + "' must be at least " + std::to_string(minimum));
  return *value;
}

int port_from(const std::string& name, const std::string& text) {
  const int port = int_at_least(name, text, 1);
  if (port > 65535) throw WorldError(name + "='" + text + "' is not a TCP port (1..65535)");
  return port;
}

// Checks shared by env and SLURM mode; `names` spell the variables each field came from.
struct VariableNames {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

void check_ranks(const WorldInfo& w, const VariableNames& names) {
  if (w.rank >= w.world_size)
    throw WorldError(std::string(names.rank) + "=" + std::to_string(w.rank) + " must be less than " + names.world_size +
                     "=" + std::to_string(w.world_size));
  if (w.local_rank >= w.local_world_size)
    throw WorldError(std::string(names.local_rank) + "=" + std::to_string(w.local_rank) + " must be less than " +
                     names.local_world_size + "=" + std::to_string(w.local_world_size));
}

WorldInfo from_torch_env(const GetEnv& getenv) {
  const auto rank = lookup(getenv, "RANK");
  const auto world = lookup(getenv, "WORLD_SIZE");
  if (!rank || !world) {
    const char* missing = rank ? "WORLD_SIZE" : "RANK";
    const char* present = rank ? "RANK" : "WORLD_SIZE";
    throw WorldError(std::string(missing) + " is not set although " + present +
                     " is; both come from the launcher: " + kLaunchHint);
  }
  WorldInfo w;
  w.source = "env";
  w.rank = int_at_least("RANK", *rank, 0);
  w.world_size = int_at_least("WORLD_SIZE", *world, 1);
  if (auto v = lookup(getenv, "LOCAL_RANK")) w.local_rank = int_at_least("LOCAL_RANK", *v, 0);
  // The node's process count: LOCAL_WORLD_SIZE, else (a launcher that sets LOCAL_RANK alone, an MPI
  // wrapper; c10d does not need it) the MPI launcher's own variable, else at least local_rank + 1
  // (only the CPU thread split reads it: an undercount gives the node's low ranks more threads).
  w.local_world_size = w.local_rank + 1;
  const char* local_size_from = "LOCAL_WORLD_SIZE";
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"}) {
    if (auto n = lookup(getenv, name)) {
      w.local_world_size = int_at_least(name, *n, 1);
      local_size_from = name;
      break;
    }
  }
  check_ranks(w, {"RANK", "WORLD_SIZE", "LOCAL_RANK", local_size_from});

  const auto addr = lookup(getenv, "MASTER_ADDR");
  const auto port = lookup(getenv, "MASTER_PORT");
  if (w.world_size > 1 && (!addr || !port))
    throw WorldError(std::string(addr ? "MASTER_PORT" : "MASTER_ADDR") + " is not set but WORLD_SIZE=" +
                     std::to_string(w.world_size) + " needs a rendezvous address; " + kLaunchHint);
  if (addr) w.master_addr = *addr;
  if (port) w.master_port = port_from("MASTER_PORT", *port);

  if (lookup(getenv, "TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    w.agent_store = true;
    int attempt = 0;
    if (auto v = lookup(getenv, "TORCHELASTIC_RESTART_COUNT"))
      attempt = int_at_least("TORCHELASTIC_RESTART_COUNT", *v, 0);
    w.store_prefix = "/worker/attempt_" + std::to_string(attempt);
  }
  return w;
}

// "4(x2),3" -> {4, 4, 3}: SLURM's compressed tasks-per-node list, one entry per node.
std::vector<int> expand_tasks_per_node(const std::string& name, const std::string& text) {
  std::vector<int> per_node;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    const size_t paren = item.find('(');
    const auto count = parse_int(item.substr(0, paren));
    if (!count) throw WorldError(name + "='" + text + "' is not a SLURM task count list");
    int repeat = 1;
    if (paren != std::string::npos) {
      const std::string inner = item.substr(paren);  // "(x2)"
      const auto r = inner.size() > 3 && inner.rfind("(x", 0) == 0 && inner.back() == ')'
                         ? parse_int(std::string_view(inner).substr(2, inner.size() - 3))
                         : std::nullopt;
      if (!r || *r < 1) throw WorldError(name + "='" + text + "' is not a SLURM task count list");
      repeat = *r;
    }
    per_node.insert(per_node.end(), repeat, *count);
    pos = comma + 1;
  }
  return per_node;
}

int slurm_local_world_size(const GetEnv& getenv) {
  // The step's own layout first: srun can lay a step out differently from the allocation
  // (srun -N1 -n2 inside a 4-tasks-per-node job), and the job-level variables describe the latter.
  const char* const per_node_list =
      lookup(getenv, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  if (!lookup(getenv, "SLURM_STEP_TASKS_PER_NODE")) {
    if (auto v = lookup(getenv, "SLURM_NTASKS_PER_NODE"); v && parse_int(*v))
      return int_at_least("SLURM_NTASKS_PER_NODE", *v, 1);
  }
  if (auto v = lookup(getenv, per_node_list)) {
    const std::vector<int> per_node = expand_tasks_per_node(per_node_list, *v);
    // Heterogeneous allocations ("4(x2),3") differ per node: pick this node's entry when SLURM says
    // which node this is, else the first.
    size_t node = 0;
    if (auto id = lookup(getenv, "SLURM_NODEID")) node = static_cast<size_t>(int_at_least("SLURM_NODEID", *id, 0));
    const int count = per_node[node < per_node.size() ? node : 0];
    if (count < 1) throw WorldError(std::string(per_node_list) + "='" + *v + "' gives this node no tasks");
    return count;
  }
  return 1;
}

// Whether this process is a task of an srun job step, the only SLURM launch whose tasks form a
// world. The batch script (task 0 of the batch step) and an salloc shell carry the allocation's
// SLURM_PROCID / SLURM_NTASKS too, but no SLURM_STEP_NUM_TASKS (only srun sets it, with
// SLURM_STEP_ID: Slurm's src/common/env.c, env_array_for_step; setup_env skips the batch step's
// id), and salloc's interactive step has a reserved step id (0xfffffffa; batch, extern and the
// others sit next to it): a program started there is one process, not task 0 of N.
bool in_srun_step(const GetEnv& getenv) {
  if (!lookup(getenv, "SLURM_PROCID") || !lookup(getenv, "SLURM_STEP_NUM_TASKS")) return false;
  const auto step = lookup(getenv, "SLURM_STEP_ID");
  const auto id = step ? parse_int<unsigned long long>(*step) : std::nullopt;
  return id && *id < 0xfffffff0ULL;
}

WorldInfo from_slurm_env(const GetEnv& getenv) {
  WorldInfo w;
  w.source = "slurm";
  w.rank = int_at_least("SLURM_PROCID", *lookup(getenv, "SLURM_PROCID"), 0);
  // The step's task count: SLURM_NTASKS is the allocation's under srun --preserve-env.
  w.world_size = int_at_least("SLURM_STEP_NUM_TASKS", *lookup(getenv, "SLURM_STEP_NUM_TASKS"), 1);
  if (auto v = lookup(getenv, "SLURM_LOCALID")) w.local_rank = int_at_least("SLURM_LOCALID", *v, 0);
  w.local_world_size = slurm_local_world_size(getenv);
  check_ranks(w, {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
                  lookup(getenv, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                                                              : "SLURM_NTASKS_PER_NODE/SLURM_TASKS_PER_NODE"});

  // Rank 0 runs on the first node of the step, which is not the job's first node when the step
  // uses part of the allocation (srun -N2 -r2): the step's list first.
  if (auto addr = lookup(getenv, "MASTER_ADDR")) {
    w.master_addr = *addr;
  } else if (auto step_list = lookup(getenv, "SLURM_STEP_NODELIST")) {
    w.master_addr = first_host_of_nodelist(*step_list);
  } else if (auto list = lookup(getenv, "SLURM_JOB_NODELIST")) {
    w.master_addr = first_host_of_nodelist(*list);
  } else if (auto old_list = lookup(getenv, "SLURM_NODELIST")) {
    w.master_addr = first_host_of_nodelist(*old_list);
  } else if (w.world_size > 1) {
    throw WorldError(
        "MASTER_ADDR is not set and none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST names the nodes; "
        "export MASTER_ADDR=<first node> in the job script");
  }
  if (auto port = lookup(getenv, "MASTER_PORT")) {
    w.master_port = port_from("MASTER_PORT", *port);
  } else if (auto job = lookup(getenv, "SLURM_JOB_ID")) {
    // Two jobs (or two steps of one job) sharing a node must not both take 29500: every rank of
    // a step derives the same port from the job and step ids, in the range scripts/slurm/common.sh uses.
    const auto job_id = parse_int<unsigned long long>(*job);
    if (!job_id) throw WorldError("SLURM_JOB_ID='" + *job + "' is not an integer");
    const auto step = lookup(getenv, "SLURM_STEP_ID");
    const unsigned long long step_id = step ? parse_int<unsigned long long>(*step).value_or(0) : 0;
    w.master_port = static_cast<int>(15000 + (*job_id % 15000 + 7919 * (step_id % 15000)) % 15000);
  }
  return w;
}

}  // namespace

std::string WorldInfo::describe() const {
  if (source == "single") return "rank 0/1 (single process)";
  std::string line = "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " (local " +
                     std::to_string(local_rank) + "/" + std::to_string(local_world_size) + ") master " + master_addr +
                     ":" + std::to_string(master_port) + " via " + source;
  if (agent_store) line += " (torchrun agent store " + store_prefix + ")";
  return line;
}

WorldInfo world_from_environment(const GetEnv& getenv) {
  if (lookup(getenv, "RANK") || lookup(getenv, "WORLD_SIZE")) return from_torch_env(getenv);
  if (in_srun_step(getenv)) return from_slurm_env(getenv);
  return WorldInfo{};
}

std::string this_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string first_host_of_nodelist(const std::string& nodelist) {
  // Hosts are separated by top-level commas; each "[a-b,c]" range contributes its first value,
  // and text after "]" belongs to the same host ("rack[1-2]-ib" -> "rack1-ib").
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) throw WorldError("SLURM node list '" + nodelist + "' has an unclosed '['");
    const size_t first_end = nodelist.find_first_of("-,]", i + 1);
    const std::string first = nodelist.substr(i + 1, first_end - i - 1);
    if (first.empty()) throw WorldError("SLURM node list '" + nodelist + "' has an empty range");
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw WorldError("SLURM node list '" + nodelist + "' names no host");
  return host;
}

}  // namespace gpipe
