// The multi-process side of a run: the c10d rendezvous (TCPStore on MASTER_ADDR:MASTER_PORT,
// hosted by rank 0, or by torchrun's agent), the Gloo process group for CPU tensors and the
// small collectives of a step (loss, gradient norm), process groups over some of the processes
// (a pipeline replica's; a stage's replicas, for replicated stages), the config-hash check, and a
// peer monitor that turns a lost rank into an error on every other rank instead of a hang.
//
// Failure protocol: a rank that fails posts "abort" = its reason to the store; every rank's
// monitor polls the store and heartbeats each second, aborts its transport when it sees an
// abort, a peer whose heartbeat stopped for parallel.peer_timeout_s, or a store that vanished
// (rank 0 hosts it). Receives from a killed neighbour fail at once (the socket closes).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer/launch/world.h"

namespace at {
class Tensor;
}

namespace gpipe {

class Transport;
struct Schedule;
struct Placement;

// The rendezvous failed: port in use, master unreachable, a rank that never joined. Exit code 1.
struct RendezvousError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A c10d process group over some of the run's processes: one pipeline replica's processes, or
// the replicas of one stage (parallel.data_parallel_size). Its collectives end early, with the
// reason, when the monitor learns of a failure, like Distributed's own. Made by
// Distributed::new_group; not copyable.
class ProcessGroup {
 public:
  // A collective started by start_all_reduce_sum; wait() before reading its tensors.
  class Pending {
   public:
    Pending();
    Pending(Pending&&) noexcept;
    Pending& operator=(Pending&&) noexcept;
    ~Pending();
    // Blocks until the sum is in the tensors; throws naming the failure (lost rank, timeout).
    void wait();
    struct Impl;
    explicit Pending(std::unique_ptr<Impl> impl);

   private:
    std::unique_ptr<Impl> impl_;
  };

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  const std::string& name() const;
  const std::string& backend() const;  // "gloo" | "nccl"
  int rank() const;                    // this process's index in members()
  int size() const;
  const std::vector<int>& members() const;  // world ranks, ascending

  // Element-wise sum over the members (float64, on CPU; gloo groups).
  std::vector<double> all_reduce_sum(std::vector<double> values);
  // In place, a contiguous tensor (CPU for gloo, CUDA for nccl) summed over the members.
  void all_reduce_sum_in_place(at::Tensor& tensor);
  // Starts the in-place sum of `tensor` and returns at once; every member must start the same
  // collectives in the same order (c10d matches them by sequence).
  Pending start_all_reduce_sum(at::Tensor tensor);

  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

struct DistributedOptions {
  std::chrono::milliseconds timeout{120000};   // rendezvous, receives, silent heartbeats
  std::chrono::milliseconds heartbeat{1000};  // how often the monitor beats and looks
};

class Distributed {
 public:
  // Connects (rank 0 binds MASTER_PORT unless torchrun's agent hosts the store), waits until all
  // WORLD_SIZE ranks joined (else RendezvousError naming the missing ranks), checks that every
  // rank runs the same config (ConfigError naming this rank and rank 0 otherwise), creates the
  // Gloo process group and starts the monitor.
  static std::unique_ptr<Distributed> connect(const WorldInfo& world, const std::string& config_hash,
                                              DistributedOptions options = {});
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  int rank() const;
  int world_size() const;
  const WorldInfo& world() const;
  std::chrono::milliseconds timeout() const;

  // Element-wise sum over all processes (Gloo all-reduce, float64, on CPU).
  std::vector<double> all_reduce_sum(std::vector<double> values);
  // In place, element-wise sum of a contiguous CPU tensor over all processes (Gloo all-reduce;
  // every process must call it, with the same shape and dtype).
  void all_reduce_sum_in_place(at::Tensor& tensor);
  void barrier();
  // A process group of `members` (world ranks): every member calls this with the same name and
  // members, and members make their groups in the same order (each waits for the others, up to
  // the timeout). backend "gloo" (CPU tensors) or "nccl" (CUDA tensors; CUDA builds).
  // Throws RendezvousError when the members do not all join, ConfigError for a backend this
  // build lacks.
  std::unique_ptr<ProcessGroup> new_group(const std::string& name, std::vector<int> members,
                                          const std::string& backend);
  // Rank 0's `value` on every rank (through the store, under `name`).
  std::string broadcast_from_rank0(const std::string& name, const std::string& value);
  // Every rank's `value`, in rank order, on rank 0 (empty elsewhere); rank 0 waits for all.
  std::vector<std::string> gather_to_rank0(const std::string& name, const std::string& value);

  // The transport between this process's pipeline ranks and the others': in memory between
  // local ranks, Gloo ("gloo", CPU tensors, matched by tag) or NCCL ("nccl", CUDA tensors, one
  // communicator per directed pair of ranks, matched in order) across processes. The monitor
  // aborts it when a peer is lost; call unwatch() before destroying it.
  std::unique_ptr<Transport> make_transport(const std::string& kind, const Placement& placement,
                                            const Schedule& schedule);
  void unwatch(Transport* transport);

  // This rank failed with `reason`: tell the others (first reason wins) and give them a moment to
  // read it before this process exits and, on rank 0, takes the store down.
  void announce_failure(const std::string& reason);
  // What another rank announced or the monitor concluded (lost peer, lost store), if anything.
  std::optional<std::string> failure() const;
  // Orderly end of a successful run: stops the monitor; rank 0 (the store's host) waits until
  // every rank is done with the store.
  void finish();

  struct Impl;

 private:
  explicit Distributed(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One all-reduce between two Gloo ranks on this machine (two threads over loopback TCP, as two
// processes of a node): latency (ms, a one-element tensor) and ms per byte beyond it (`bytes`).
// What --plan charges data-parallel replicas per collective.
struct LinkCost {
  double latency_ms = 0;
  double ms_per_byte = 0;
};
LinkCost measure_gloo_allreduce(int64_t bytes);

}  // namespace gpipe
