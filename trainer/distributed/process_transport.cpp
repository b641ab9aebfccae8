// The Gloo cross-process transport: local pipeline ranks exchange tensors through the in-process
// mailbox; a tensor for a rank of another process goes as two Gloo point-to-point messages, a
// fixed-size header (dtype and shape) and the data, tagged by (kind, stage, micro-batch). Gloo
// matches messages by tag, so the order in which ranks post them does not matter and sends never
// wait for the receiver.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <deque>
#include <mutex>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "cross_process_transport.h"

namespace gpipe {
namespace {

constexpr int kHeaderSize = 10;  // dtype, ndim, up to 8 dimensions
constexpr int kMaxDims = kHeaderSize - 2;

class GlooProcessTransport final : public CrossProcessTransport {
 public:
  using CrossProcessTransport::CrossProcessTransport;
  ~GlooProcessTransport() override { abort_remote(); }

  size_t reset() override {
    clear_abort();
    {
      // A failed step's sends may never be asked for: set aside, never waited on (not destroyed
      // either: Gloo may still write from their tensors until the pair closes).
      std::lock_guard<std::mutex> lock(works_mu_);
      for (HeldSend& s : sends_) abandoned_.push_back(std::move(s.work));
      sends_.clear();
    }
    return local_->reset();
  }

 private:
  void send_remote(const TransferKey& key, Message message, int to) override {
    at::Tensor data = message.tensor.detach().contiguous();
    if (!data.device().is_cpu()) {
      throw TransportError(fmt::format("the gloo transport carries CPU tensors but the {} is on {}; use "
                                       "parallel.transport nccl for CUDA stages", to_string(key), data.device().str()));
    }
    if (data.dim() > kMaxDims) throw TransportError(fmt::format("{} has {} dimensions (at most {})", to_string(key), data.dim(), kMaxDims));
    at::Tensor header = at::zeros({kHeaderSize}, at::kLong);
    auto* h = header.data_ptr<int64_t>();
    h[0] = static_cast<int64_t>(data.scalar_type());
    h[1] = data.dim();
    for (int64_t d = 0; d < data.dim(); ++d) h[2 + d] = data.size(d);
    const int peer = placement_.process_of(to);
    const int tag = tag_of(key);
    std::vector<at::Tensor> header_list{header}, data_list{data};
    c10::intrusive_ptr<c10d::Work> w1, w2;
    try {
      w1 = dist_.gloo->send(header_list, peer, 2 * tag);
      w2 = dist_.gloo->send(data_list, peer, 2 * tag + 1);
    } catch (const std::exception& e) {
      check_not_aborted("send of " + to_string(key));
      if (auto announced = announced_failure()) throw TransportError("send of " + to_string(key) + " aborted: " + *announced);
      throw TransportError(fmt::format("lost rank {} (it runs pipeline rank {}): the connection failed while pipeline "
                                       "rank {} was sending it the {} ({})", peer, to, rank_of(key.sender_stage()),
                                       to_string(key), error_text(e)));
    }
    bytes_sent_ += static_cast<uint64_t>(data.nbytes() + header.nbytes());
    std::lock_guard<std::mutex> lock(works_mu_);
    // Kept (they keep their tensors alive) until release_delivered(): a Gloo send work says it is
    // completed only once waited on, and waiting here would block until the receiver asks.
    sends_.push_back({key, std::move(w1)});
    sends_.push_back({key, std::move(w2)});
  }

  void release_delivered(std::chrono::milliseconds timeout) override {
    std::deque<HeldSend> sends;
    {
      std::lock_guard<std::mutex> lock(works_mu_);
      sends.swap(sends_);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const HeldSend& s : sends) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      try {
        s.work->wait(std::max(left, std::chrono::milliseconds(1)));
      } catch (const std::exception& e) {
        throw TransportError(fmt::format("the send of the {} was not delivered within {} ms of the step's end, "
                                         "though every process finished the step: {}",
                                         to_string(s.key), timeout.count(), error_text(e)));
      }
    }
  }

  bool remote_recv_waits_on_host() const override { return true; }

  Message recv_remote(const TransferKey& key, std::chrono::milliseconds timeout, int from) override {
    const int peer = placement_.process_of(from);
    const int tag = tag_of(key);
    // A sender whose heartbeat stops is lost after `timeout`: the monitor aborts this transport
    // and the receive ends with its reason. A sender that beats is alive but slow (a checkpoint
    // to a shared filesystem, a first step's warm-up): wait for it as the gather does, up to
    // PeerDeadline::kLiveWaits x the timeout, so a live but hung peer still ends in an error.
    timeout = std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 365))) * PeerDeadline::kLiveWaits;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    at::Tensor header = at::zeros({kHeaderSize}, at::kLong);
    wait_recv(header, peer, 2 * tag, key, from, timeout, timeout);
    const auto* h = header.data_ptr<int64_t>();
    if (h[1] < 0 || h[1] > kMaxDims) {
      throw TransportError(fmt::format("a corrupt header arrived for the {} from rank {}", to_string(key), from));
    }
    std::vector<int64_t> shape(h + 2, h + 2 + h[1]);
    at::Tensor data = at::empty(shape, at::TensorOptions().dtype(static_cast<at::ScalarType>(h[0])));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    wait_recv(data, peer, 2 * tag + 1, key, from, std::max(left, std::chrono::milliseconds(1)), timeout);
    return Message{data, nullptr};
  }

  void abort_remote() override {
    std::vector<c10::intrusive_ptr<c10d::Work>> receives;
    {
      std::lock_guard<std::mutex> lock(works_mu_);
      receives.assign(receives_.begin(), receives_.end());  // owned: a receiver may drop its own meanwhile
    }
    for (const auto& w : receives) w->abort();
  }

  // Unique per message of a step: kind x stage x micro-batch, micro-batch outermost, so that a
  // run with more micro-batches than the schedule it was made for (an asp window) stays unique.
  int tag_of(const TransferKey& key) const {
    return (key.microbatch * 2 + static_cast<int>(key.kind)) * num_stages_ + key.stage;
  }

  // The reason another rank posted to the store, if any (the store may be gone too).
  std::optional<std::string> announced_failure() {
    try {
      if (dist_.store->check({"abort"})) {
        const auto raw = dist_.store->get("abort");
        return std::string(raw.begin(), raw.end());
      }
    } catch (const std::exception&) {
    }
    return std::nullopt;
  }

  // `timeout`: this message's share of the receive's `whole` bound (named in the error).
  void wait_recv(at::Tensor& into, int peer, int tag, const TransferKey& key, int from, std::chrono::milliseconds timeout,
                 std::chrono::milliseconds whole) {
    std::vector<at::Tensor> list{into};
    c10::intrusive_ptr<c10d::Work> work;
    {
      // Checked and registered under one lock: abort() records its reason before abort_remote()
      // takes this lock, so a receive is either refused here or aborted there.
      std::lock_guard<std::mutex> lock(works_mu_);
      check_not_aborted("recv of " + to_string(key));
      work = dist_.gloo->recv(list, peer, tag);
      receives_.insert(work);
    }
    std::string error;
    try {
      work->wait(timeout);
    } catch (const std::exception& e) {
      error = error_text(e);
    }
    {
      std::lock_guard<std::mutex> lock(works_mu_);
      receives_.erase(work);
    }
    if (error.empty()) return;
    check_not_aborted("recv of " + to_string(key));
    const std::string where = fmt::format("pipeline rank {} was waiting for the {} from pipeline rank {} on rank {}",
                                          rank_of(key.stage), to_string(key), from, peer);
    if (error.find("imed out") != std::string::npos || error.find("imeout") != std::string::npos) {
      throw TransportTimeout(fmt::format("{} for {} ms ({} x the receive's timeout, parallel.peer_timeout_s in "
                                         "training) and it never came: rank {} hangs (a rank that dies or stops "
                                         "beating ends the wait sooner), or the processes run schedules that differ; {}",
                                         where, whole.count(), PeerDeadline::kLiveWaits, peer, error));
    }
    // A peer that failed announced why before it exited and closed the connection: prefer that.
    if (auto announced = announced_failure()) throw TransportError("recv of " + to_string(key) + " aborted: " + *announced);
    throw TransportError(fmt::format("lost rank {} (it runs pipeline rank {}): the connection failed while {} ({})",
                                     peer, from, where, error));
  }

  struct HeldSend {
    TransferKey key;
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::mutex works_mu_;
  std::deque<HeldSend> sends_;
  std::vector<c10::intrusive_ptr<c10d::Work>> abandoned_;
  std::set<c10::intrusive_ptr<c10d::Work>> receives_;
};

}  // namespace

std::unique_ptr<Transport> make_gloo_process_transport(Distributed::Impl& dist, const Placement& placement,
                                                       const Schedule& schedule) {
  return std::make_unique<GlooProcessTransport>(dist, placement, schedule);
}

}  // namespace gpipe
