// In-process transport: a mailbox map guarded by one mutex; receivers wait on a condition
// variable with a deadline, so a missing sender becomes a named error instead of a hang.
#include <condition_variable>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "trainer/distributed/transport.h"

namespace gpipe {

const char* to_string(TransferKind kind) {
  return kind == TransferKind::kActivation ? "activation" : "gradient";
}

std::string to_string(const TransferKey& key) {
  return fmt::format("{} for stage {}, micro-batch {}", to_string(key.kind), key.stage, key.microbatch);
}

namespace {

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(int num_ranks, std::vector<int> stage_to_rank)
      : num_ranks_(num_ranks < 1 ? 1 : num_ranks), stage_to_rank_(std::move(stage_to_rank)) {}

  void send(const TransferKey& key, Message message) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.empty()) throw TransportError("send of " + to_string(key) + " after abort: " + aborted_);
      auto [it, inserted] = mailbox_.emplace(key, std::move(message));
      if (!inserted) {
        throw TransportError(fmt::format("{} was sent twice before being received (stage {} on rank {}): "
                                         "the schedule sends one key twice",
                                         to_string(key), key.sender_stage(), rank_of(key.sender_stage())));
      }
    }
    cv_.notify_all();
  }

  Message recv(const TransferKey& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    const bool arrived = cv_.wait_for(lock, timeout, [&] { return !aborted_.empty() || mailbox_.count(key) > 0; });
    if (!aborted_.empty()) throw TransportError("recv of " + to_string(key) + " aborted: " + aborted_);
    if (!arrived) {
      const int peer = key.sender_stage();
      throw TransportTimeout(fmt::format(
          "rank {} waited {} ms for the {} from stage {} on rank {}, which never sent it "
          "(a peer that failed, or a schedule whose sends and receives do not match; check --print-schedule)",
          rank_of(key.stage), timeout.count(), to_string(key), peer, rank_of(peer)));
    }
    auto it = mailbox_.find(key);
    Message message = std::move(it->second);
    mailbox_.erase(it);
    return message;
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.empty()) aborted_ = reason.empty() ? "aborted" : reason;
    }
    cv_.notify_all();
  }

  size_t reset() override {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t dropped = mailbox_.size();
    mailbox_.clear();
    aborted_.clear();
    return dropped;
  }

  std::string aborted_reason() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

  size_t pending() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return mailbox_.size();
  }

 private:
  // The rank that holds `stage` (zbv, dualpipev and schedule files place stages their own way).
  int rank_of(int stage) const {
    if (stage >= 0 && stage < static_cast<int>(stage_to_rank_.size())) return stage_to_rank_[static_cast<size_t>(stage)];
    return ((stage % num_ranks_) + num_ranks_) % num_ranks_;
  }

  int num_ranks_;
  std::vector<int> stage_to_rank_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<TransferKey, Message> mailbox_;
  std::string aborted_;
};

}  // namespace

std::unique_ptr<Transport> make_inprocess_transport(int num_ranks, std::vector<int> stage_to_rank) {
  return std::make_unique<InProcessTransport>(num_ranks, std::move(stage_to_rank));
}

}  // namespace gpipe
