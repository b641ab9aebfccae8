// The replay plan: streams, kernels, block times and the sm_90 launch checks (see plan.h).
#include "plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "spin_kernels.h"

namespace replay_gpu {
namespace {

using sched::OpKind;
using sched::StreamClass;
using sched::WorkloadOp;

[[noreturn]] void fail(const sched::Workload& w, const WorkloadOp& op, const std::string& what) {
  throw PlanError(w.source + ":" + std::to_string(op.line) + ": " + (op.name.empty() ? sched::to_string(op.kind) : op.name) +
                  ": " + what);
}

std::string dim(const sched::Dim3& d) {
  std::string text = std::to_string(d.x);
  if (d.y != 1 || d.z != 1) text += "x" + std::to_string(d.y);
  if (d.z != 1) text += "x" + std::to_string(d.z);
  return text;
}

// CUDA's grid and block limits are the workload reader's (sched::load_workload refuses them);
// what is left is sm_90's shared memory.
void check_shape(const sched::Workload& w, const WorkloadOp& op) {
  if (op.smem > kMaxSharedMemPerBlock) {
    fail(w, op, "smem " + std::to_string(op.smem) + " bytes per block: an sm_90 SM has 228 KiB of shared memory, at "
                    "most " + std::to_string(kMaxSharedMemPerBlock) + " bytes (227 KiB) for one block");
  }
}

// Resident blocks of this shape per SM on sm_90 for our spin kernel (few registers: threads,
// blocks and shared memory limit it).
int hardware_blocks_per_sm(uint64_t threads, uint32_t smem) {
  uint64_t by_threads = kMaxThreadsPerSm / std::max<uint64_t>(threads, 1);
  uint64_t by_smem = kSharedMemPerSm / (uint64_t{smem} + kReservedSharedMemPerBlock);
  return static_cast<int>(std::min<uint64_t>({by_threads, by_smem, kMaxBlocksPerSm}));
}

const char* priority_of(StreamClass cls) {
  return cls == StreamClass::kHighPriority ? "greatest" : "least";
}

}  // namespace

size_t Plan::streams_of(StreamClass cls) const {
  return static_cast<size_t>(std::count_if(streams.begin(), streams.end(), [&](const PlanStream& s) { return s.cls == cls; }));
}

Plan make_plan(const sched::Workload& w, int sm_count) {
  if (sm_count < 1) throw PlanError("SM count " + std::to_string(sm_count) + ": expected at least 1");
  sched::SimGpuConfig config;
  config.sm_count = sm_count;
  // The simulator derives block times and blocks per SM; the replay launches exactly that.
  sched::SimulatedGpu gpu(config);
  Plan plan;
  plan.source = w.source;
  plan.sm_count = sm_count;
  plan.copy_bytes_per_ns = config.copy_bytes_per_ns;
  plan.memset_bytes_per_ns = config.memset_bytes_per_ns;
  plan.clients = w.clients();
  plan.ops.resize(w.ops.size());

  std::map<sched::StreamId, size_t> stream_index;
  std::map<std::string, size_t> kernel_index;
  std::set<std::string> requests_seen;
  std::set<sched::EventId> events;
  bool smem_raised = false;
  std::map<std::pair<int, int>, std::vector<std::string>> occupancy_mismatch;  // (simulator, sm_90) -> kernels
  for (size_t i = 0; i < w.ops.size(); ++i) {
    const WorkloadOp& op = w.ops[i];
    auto [sit, new_stream] = stream_index.emplace(op.stream_id, plan.streams.size());
    if (new_stream) {
      PlanStream s;
      s.name = op.stream;
      s.id = op.stream_id;
      s.cls = op.cls;
      plan.streams.push_back(s);
    }
    PlanStream& stream = plan.streams[sit->second];
    if (std::find(stream.clients.begin(), stream.clients.end(), op.client) == stream.clients.end()) {
      stream.clients.push_back(op.client);
    }
    ++stream.ops;
    if (requests_seen.insert(op.request).second) {
      ++plan.requests;
      if (!op.after_request.empty() && requests_seen.count(op.after_request)) ++plan.closed_loop_requests;
    }
    PlanOp& p = plan.ops[i];
    switch (op.kind) {
      case OpKind::kKernel: {
        check_shape(w, op);
        const sched::KernelInfo info = w.kernel_info(op, gpu);
        const int sim_per_sm = std::max(1, gpu.max_active_blocks_per_sm(info));
        const uint64_t threads = op.block.count();
        p.launch_smem = op.smem;
        if (op.blocks_per_sm > 0 && hardware_blocks_per_sm(threads, op.smem) > static_cast<int>(op.blocks_per_sm)) {
          // The file caps residency below what the hardware allows: ask for enough shared memory
          // that only blocks_per_sm blocks fit an SM.
          const uint32_t need = kSharedMemPerSm / (op.blocks_per_sm + 1) + 1 - kReservedSharedMemPerBlock;
          p.launch_smem = std::min(std::max(op.smem, need), kMaxSharedMemPerBlock);
          smem_raised = true;
        }
        const uint64_t slots = static_cast<uint64_t>(sim_per_sm) * static_cast<uint64_t>(sm_count);
        const uint64_t waves = std::max<uint64_t>(1, (op.grid.count() + slots - 1) / slots);
        p.block_ns = info.sim_block_ns > 0 ? info.sim_block_ns : config.default_block_ns;
        p.expected_ns = p.block_ns * static_cast<double>(waves);
        auto [kit, new_kernel] = kernel_index.emplace(op.name, plan.kernels.size());
        if (new_kernel) {
          const int hw_per_sm = hardware_blocks_per_sm(threads, p.launch_smem);
          if (hw_per_sm != sim_per_sm) occupancy_mismatch[{sim_per_sm, hw_per_sm}].push_back(op.name);
          PlanKernel k;
          k.name = op.name;
          k.slot = static_cast<int>(plan.kernels.size() % kSpinKernelSlots);
          k.grid = op.grid;
          k.block = op.block;
          k.smem = op.smem;
          k.launch_smem = p.launch_smem;
          k.blocks_per_sm = sim_per_sm;
          k.waves = waves;
          k.block_ns = p.block_ns;
          k.alone_ns = p.expected_ns;
          plan.kernels.push_back(k);
        }
        ++plan.kernels[kit->second].launches;
        p.kernel = static_cast<int>(kit->second);
        ++stream.kernels;
        plan.kernel_busy_ns += p.expected_ns;
        break;
      }
      case OpKind::kCopy:
        p.expected_ns = static_cast<double>(op.bytes) / config.copy_bytes_per_ns;
        plan.max_copy_bytes = std::max(plan.max_copy_bytes, op.bytes);
        plan.copy_busy_ns += p.expected_ns;
        ++stream.copies;
        break;
      case OpKind::kMemset:
        p.expected_ns = static_cast<double>(op.bytes) / config.memset_bytes_per_ns;
        plan.max_memset_bytes = std::max(plan.max_memset_bytes, op.bytes);
        plan.memset_busy_ns += p.expected_ns;
        ++stream.memsets;
        break;
      case OpKind::kEventRecord:
      case OpKind::kStreamWaitEvent:
        events.insert(op.event);
        ++stream.events;
        break;
      case OpKind::kGraphLaunch:
        // Opaque: one spin block for the graph's time (the simulator gives it no SMs).
        p.block_ns = op.block_ns > 0 ? op.block_ns : config.default_block_ns;
        p.expected_ns = p.block_ns;
        plan.kernel_busy_ns += p.expected_ns;
        ++stream.others;
        break;
      case OpKind::kHostFunc:
      case OpKind::kMemPool:
        ++stream.others;
        break;
    }
    stream.busy_ns += p.expected_ns;
    plan.client_busy_ns[op.client] += p.expected_ns;
  }
  plan.events = events.size();
  for (const auto& [per_sm, names] : occupancy_mismatch) {
    plan.notes.push_back(std::to_string(names.size()) + " kernels (" + names.front() + (names.size() > 1 ? ", ..." : "") +
                         "): the simulator puts " + std::to_string(per_sm.first) + " blocks on an SM, sm_90 " +
                         std::to_string(per_sm.second) + " (it reserves 1 KiB of shared memory per block): waves differ "
                         "where a grid needs more than one");
  }
  if (plan.kernels.size() > static_cast<size_t>(kSpinKernelSlots)) {
    plan.notes.push_back(std::to_string(plan.kernels.size()) + " kernel names share " +
                         std::to_string(kSpinKernelSlots) + " spin-kernel copies: the shim sees fewer distinct kernels");
  }
  if (smem_raised) {
    plan.notes.push_back("some launches ask for more shared memory than the file says, so that no more than the "
                         "file's blocks_per_sm fit an SM");
  }
  if (plan.max_copy_bytes > 0) {
    plan.notes.push_back("copies are host-to-device from pinned memory; their bytes are scaled to take bytes / "
                         "--copy-rate-gbps on the GPU (the simulator's rate by default)");
  }
  return plan;
}

std::string format_plan(const Plan& plan) {
  std::ostringstream out;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "workload %s: %zu ops, %zu clients, %zu streams (%zu high priority, %zu best effort, %zu communication, "
                "%zu unmanaged), %zu requests (%zu closed loop), %zu events\n",
                plan.source.c_str(), plan.ops.size(), plan.clients.size(), plan.streams.size(),
                plan.streams_of(StreamClass::kHighPriority), plan.streams_of(StreamClass::kBestEffort),
                plan.streams_of(StreamClass::kCommunication), plan.streams_of(StreamClass::kUnmanaged), plan.requests,
                plan.closed_loop_requests, plan.events);
  out << buf;
  std::snprintf(buf, sizeof buf,
                "plan for %d SMs (sm_90: %u KiB shared memory per SM, at most %u threads per block); block times as "
                "the simulator's\n\n",
                plan.sm_count, kSharedMemPerSm / 1024, kMaxThreadsPerBlock);
  out << buf;
  out << "| stream | class | priority | clients | ops | kernels | copies | memsets | events | other | expected busy ms |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const PlanStream& s : plan.streams) {
    std::string clients;
    for (const std::string& c : s.clients) clients += (clients.empty() ? "" : ", ") + c;
    std::snprintf(buf, sizeof buf, "| %s | %s | %s | %s | %zu | %zu | %zu | %zu | %zu | %zu | %.3f |\n", s.name.c_str(),
                  sched::to_string(s.cls), priority_of(s.cls), clients.c_str(), s.ops, s.kernels, s.copies, s.memsets,
                  s.events, s.others, s.busy_ns / 1e6);
    out << buf;
  }
  std::snprintf(buf, sizeof buf, "\n%zu kernels (spin-kernel copies orion_replay_spin_<slot>):\n\n", plan.kernels.size());
  out << buf;
  out << "| kernel | slot | grid | block | smem | launch smem | blocks/SM | waves | block us | alone us | launches |\n";
  out << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const PlanKernel& k : plan.kernels) {
    std::snprintf(buf, sizeof buf, "| %s | %d | %s | %s | %u | %u | %d | %llu | %.3f | %.3f | %zu |\n", k.name.c_str(),
                  k.slot, dim(k.grid).c_str(), dim(k.block).c_str(), k.smem, k.launch_smem, k.blocks_per_sm,
                  static_cast<unsigned long long>(k.waves), k.block_ns / 1e3, k.alone_ns / 1e3, k.launches);
    out << buf;
  }
  out << "\nexpected busy time alone per client:";
  for (const std::string& c : plan.clients) {
    std::snprintf(buf, sizeof buf, " %s %.3f ms;", c.c_str(), plan.client_busy_ns.at(c) / 1e6);
    out << buf;
  }
  std::snprintf(buf, sizeof buf,
                "\ntotal expected busy time: %.3f ms (kernels %.3f ms, copies %.3f ms, memsets %.3f ms)\n",
                plan.total_busy_ns() / 1e6, plan.kernel_busy_ns / 1e6, plan.copy_busy_ns / 1e6, plan.memset_busy_ns / 1e6);
  out << buf;
  for (const std::string& n : plan.notes) out << "note: " << n << "\n";
  return out.str();
}

}  // namespace replay_gpu
