// Private base of the Gloo and NCCL transports: what both do the same way. A message between
// two pipeline ranks of this process goes through the in-memory mailbox; only messages that
// cross processes reach the subclass. It also keeps the first abort reason and the byte count.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed_internal.h"
#include "trainer/partition/placement.h"
#include "trainer/schedule/schedule.h"
#include "trainer/distributed/transport.h"

namespace gpipe {

class CrossProcessTransport : public Transport {
 public:
  CrossProcessTransport(Distributed::Impl& dist, const Placement& placement, const Schedule& schedule)
      : dist_(dist), placement_(placement), num_ranks_(schedule.num_ranks), num_stages_(schedule.num_stages()),
        stage_to_rank_(schedule.stage_to_rank),
        local_(make_inprocess_transport(schedule.num_ranks, schedule.stage_to_rank)) {}

  void send(const TransferKey& key, Message message) final {
    const int to = rank_of(key.stage);
    if (is_local(to)) return local_->send(key, std::move(message));
    check_not_aborted("send of " + to_string(key));
    send_remote(key, std::move(message), to);
  }

  Message recv(const TransferKey& key, std::chrono::milliseconds timeout) final {
    const int from = rank_of(key.sender_stage());
    if (is_local(from)) return local_->recv(key, timeout);
    check_not_aborted("recv of " + to_string(key));
    return recv_remote(key, timeout, from);
  }

  bool recv_waits_on_host(const TransferKey& key) const final {
    return is_local(rank_of(key.sender_stage())) || remote_recv_waits_on_host();
  }

  void abort(const std::string& reason) final {
    local_->abort(reason);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.empty()) aborted_ = reason.empty() ? "aborted" : reason;
    }
    abort_remote();
  }

  size_t pending() const final { return local_->pending(); }
  std::string aborted_reason() const final { return aborted(); }
  uint64_t bytes_sent() const final { return bytes_sent_.load(); }

 protected:
  // A message for pipeline rank `to` of another process; `from` likewise for receives.
  virtual void send_remote(const TransferKey& key, Message message, int to) = 0;
  virtual Message recv_remote(const TransferKey& key, std::chrono::milliseconds timeout, int from) = 0;
  // Transport::recv_waits_on_host for a message from another process.
  virtual bool remote_recv_waits_on_host() const = 0;
  // Wakes whatever waits on other processes; aborted() already holds the reason.
  virtual void abort_remote() = 0;

  // Virtual stage -> pipeline rank, as Schedule::rank_of_stage (a schedule file's placement, or
  // round robin).
  int rank_of(int stage) const {
    if (stage_to_rank_.empty()) return stage % num_ranks_;
    return stage >= 0 && stage < static_cast<int>(stage_to_rank_.size()) ? stage_to_rank_[static_cast<size_t>(stage)] : -1;
  }
  bool is_local(int rank) const { return placement_.process_of(rank) == dist_.world.rank; }
  // The abort reason, empty while none.
  std::string aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  void check_not_aborted(const std::string& what) const {
    if (std::string reason = aborted(); !reason.empty()) throw TransportError(what + " aborted: " + reason);
  }
  void clear_abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.clear();
  }

  Distributed::Impl& dist_;
  const Placement placement_;
  const int num_ranks_, num_stages_;
  const std::vector<int> stage_to_rank_;  // Schedule::stage_to_rank; empty: round robin
  const std::unique_ptr<Transport> local_;
  std::atomic<uint64_t> bytes_sent_{0};

 private:
  mutable std::mutex mu_;
  std::string aborted_;
};

}  // namespace gpipe
