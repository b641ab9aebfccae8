// The Gloo cross-process transport: local pipeline ranks exchange tensors through the in-process
// mailbox; a tensor for a rank of another process goes as two Gloo point-to-point messages, a
// fixed-size header (dtype and shape) and the data, tagged by (kind, stage, micro-batch). Gloo
// matches messages by tag, so the order in which ranks post them does not matter and sends never
// wait for the receiver.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "distributed_internal.h"
#include "trainer/placement.h"
#include "trainer/schedule.h"
#include "trainer/transport.h"

namespace gpipe {
namespace {

constexpr int kHeaderSize = 10;  // dtype, ndim, up to 8 dimensions
constexpr int kMaxDims = kHeaderSize - 2;

class GlooProcessTransport final : public Transport {
 public:
  GlooProcessTransport(Distributed::Impl& dist, const Placement& placement, const Schedule& schedule)
      : dist_(dist), placement_(placement), num_ranks_(schedule.num_ranks), num_stages_(schedule.num_stages()),
        num_microbatches_(schedule.num_microbatches), local_(make_inprocess_transport(schedule.num_ranks)) {}

  ~GlooProcessTransport() override { abort_remote("transport destroyed"); }

  void send(const TransferKey& key, Message message) override {
    const int to = rank_of(key.stage);
    if (is_local(to)) return local_->send(key, std::move(message));
    check_not_aborted("send of " + to_string(key));
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
    std::lock_guard<std::mutex> lock(mu_);
    // Completed sends are dropped as new ones go out; the works keep their tensors alive.
    while (!sends_.empty() && sends_.front()->isCompleted()) sends_.pop_front();
    sends_.push_back(std::move(w1));
    sends_.push_back(std::move(w2));
  }

  Message recv(const TransferKey& key, std::chrono::milliseconds timeout) override {
    const int from = rank_of(key.sender_stage());
    if (is_local(from)) return local_->recv(key, timeout);
    const int peer = placement_.process_of(from);
    const int tag = tag_of(key);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    at::Tensor header = at::zeros({kHeaderSize}, at::kLong);
    wait_recv(header, peer, 2 * tag, key, from, timeout);
    const auto* h = header.data_ptr<int64_t>();
    if (h[1] < 0 || h[1] > kMaxDims) {
      throw TransportError(fmt::format("a corrupt header arrived for the {} from rank {}", to_string(key), from));
    }
    std::vector<int64_t> shape(h + 2, h + 2 + h[1]);
    at::Tensor data = at::empty(shape, at::TensorOptions().dtype(static_cast<at::ScalarType>(h[0])));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    wait_recv(data, peer, 2 * tag + 1, key, from, std::max(left, std::chrono::milliseconds(1)));
    return Message{data, nullptr};
  }

  void abort(const std::string& reason) override {
    local_->abort(reason);
    abort_remote(reason);
  }

  size_t reset() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.clear();
    return local_->reset();
  }

  size_t pending() const override { return local_->pending(); }
  uint64_t bytes_sent() const override { return bytes_sent_.load(); }

 private:
  int rank_of(int stage) const { return ((stage % num_ranks_) + num_ranks_) % num_ranks_; }
  bool is_local(int rank) const { return placement_.process_of(rank) == dist_.world.rank; }
  // Unique per message of a step: kind x stage x micro-batch.
  int tag_of(const TransferKey& key) const {
    return (static_cast<int>(key.kind) * num_stages_ + key.stage) * num_microbatches_ + key.microbatch;
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

  void check_not_aborted(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.empty()) throw TransportError(what + " aborted: " + aborted_);
  }

  void abort_remote(const std::string& reason) {
    std::vector<c10::intrusive_ptr<c10d::Work>> receives;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.empty()) aborted_ = reason.empty() ? "aborted" : reason;
      receives.assign(receives_.begin(), receives_.end());  // owned: a receiver may drop its own meanwhile
    }
    for (const auto& w : receives) w->abort();
  }

  void wait_recv(at::Tensor& into, int peer, int tag, const TransferKey& key, int from, std::chrono::milliseconds timeout) {
    std::vector<at::Tensor> list{into};
    c10::intrusive_ptr<c10d::Work> work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!aborted_.empty()) throw TransportError("recv of " + to_string(key) + " aborted: " + aborted_);
      work = dist_.gloo->recv(list, peer, tag);
      receives_.insert(work);
    }
    std::string error;
    try {
      work->wait(timeout);
    } catch (const std::exception& e) {
      error = error_text(e);
    }
    std::string aborted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      receives_.erase(work);
      aborted = aborted_;
    }
    if (error.empty()) return;
    if (!aborted.empty()) throw TransportError("recv of " + to_string(key) + " aborted: " + aborted);
    const std::string where = fmt::format("pipeline rank {} was waiting for the {} from pipeline rank {} on rank {}",
                                          rank_of(key.stage), to_string(key), from, peer);
    if (error.find("imed out") != std::string::npos || error.find("imeout") != std::string::npos) {
      throw TransportTimeout(fmt::format("{} for {} ms and it never came (a peer that failed or hangs, or "
                                         "schedules that differ between processes); {}", where, timeout.count(), error));
    }
    // A peer that failed announced why before it exited and closed the connection: prefer that.
    if (auto announced = announced_failure()) throw TransportError("recv of " + to_string(key) + " aborted: " + *announced);
    throw TransportError(fmt::format("lost rank {} (it runs pipeline rank {}): the connection failed while {} ({})",
                                     peer, from, where, error));
  }

  Distributed::Impl& dist_;
  Placement placement_;
  int num_ranks_, num_stages_, num_microbatches_;
  std::unique_ptr<Transport> local_;
  std::mutex mu_;
  std::deque<c10::intrusive_ptr<c10d::Work>> sends_;
  std::set<c10::intrusive_ptr<c10d::Work>> receives_;
  std::string aborted_;
  std::atomic<uint64_t> bytes_sent_{0};
};

}  // namespace

std::unique_ptr<Transport> make_gloo_process_transport(Distributed::Impl& dist, const Placement& placement,
                                                       const Schedule& schedule) {
  return std::make_unique<GlooProcessTransport>(dist, placement, schedule);
}

}  // namespace gpipe
