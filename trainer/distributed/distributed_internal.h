// Private to distributed.cpp and the cross-process transports: the c10d objects behind
// Distributed, and the monitor's list of transports to abort.
#pragma once

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include <thread>

#include "trainer/distributed/distributed.h"

namespace gpipe {

struct Distributed::Impl {
  WorldInfo world;
  DistributedOptions options;
  std::string store_address;                 // "host:port", for messages
  c10::intrusive_ptr<c10d::Store> store;     // the main thread's client (prefixed)
  c10::intrusive_ptr<c10d::Store> monitor_store;  // the monitor's own connection
  c10::intrusive_ptr<c10d::Backend> gloo;
  std::unique_ptr<ProcessGroup> world_group;  // `gloo` as a ProcessGroup: the all-reduces over every rank

  std::thread monitor;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::set<Transport*> watched;
  // NCCL process groups (replicated stages' gradients): aborted with the transports, so that a
  // collective or device synchronisation waiting on a lost member ends (weak: a group may go first).
  std::vector<c10::weak_intrusive_ptr<c10d::Backend>> nccl_groups;
  std::optional<std::string> failure;  // first reason seen
  bool announced = false;

  // Records `reason` (first wins) and aborts every watched transport.
  void fail(const std::string& reason);
  void monitor_loop();
  // The value another rank writes under `key` (`what` names it in errors), polled; ends early when
  // the monitor records a failure, and after options.timeout. With `writer` (the rank that sets
  // it) the wait goes on while that rank's heartbeat advances (up to 10 x the timeout): a live
  // rank that is slow (a checkpoint on a shared filesystem) is waited for, a silent one is not.
  std::string wait_for_key(const std::string& key, const std::string& what, std::optional<int> writer = std::nullopt);
  // Throws the failure the monitor recorded (a lost or announcing rank), if any.
  void throw_if_failed();
  // Waits for a collective, ending early when the monitor records a failure; throws naming why.
  void wait_collective(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what);
  // Why a collective failed: another rank's announcement, or the ranks whose heartbeat stopped.
  std::string explain_collective_failure(const std::string& what, const std::exception& error);
};

// When a wait on another rank gives up: options.timeout after it began, pushed on while `peer`'s
// heartbeat advances (its process is alive: slow, e.g. writing a checkpoint to a shared
// filesystem), but never past kLiveWaits x the timeout (alive but never getting there). Without a
// peer, the plain timeout. The beat is read at most once per heartbeat period.
class PeerDeadline {
 public:
  static constexpr int kLiveWaits = 10;
  PeerDeadline(Distributed::Impl& dist, std::optional<int> peer);
  // True once the wait should give up.
  bool passed();
  // After passed(): " after rank N's heartbeat stopped", or that it was alive for kLiveWaits x the
  // timeout; empty without a peer. For the caller's message.
  std::string why() const;

 private:
  using Clock = std::chrono::steady_clock;
  static std::chrono::milliseconds capped(std::chrono::milliseconds timeout);
  Distributed::Impl& dist_;
  std::optional<int> peer_;
  Clock::time_point deadline_, hard_deadline_, next_look_;
  int64_t last_beat_ = -1;
};

// An exception's message without the C++ backtrace c10::Error appends (one line per log entry).
inline std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// A Gloo process group of `size` processes meeting in `store` (GLOO_SOCKET_IFNAME picks the
// interfaces); blocks until all joined or `timeout`.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout);

// A ProcessGroup over an existing c10d backend (process_group.cpp): Distributed::new_group's
// groups and the world group.
std::unique_ptr<ProcessGroup> make_process_group(Distributed::Impl& dist, std::string name, std::string backend_name,
                                                 int rank, std::vector<int> members,
                                                 c10::intrusive_ptr<c10d::Backend> backend);

// Creates the Gloo cross-process transport (process_transport.cpp) and the NCCL one
// (nccl_transport.cpp, CUDA builds only).
std::unique_ptr<Transport> make_gloo_process_transport(Distributed::Impl& dist, const Placement& placement,
                                                       const Schedule& schedule);
std::unique_ptr<Transport> make_nccl_process_transport(Distributed::Impl& dist, const Placement& placement,
                                                       const Schedule& schedule);

}  // namespace gpipe
