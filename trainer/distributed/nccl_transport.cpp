// The NCCL cross-process transport for CUDA stages. Each directed pair of pipeline ranks in
// different processes gets its own two-rank communicator and CUDA stream: a communicator then
// carries messages one way only, so a send can never wait on a receive that waits on a send
// (the cycle that grouping with ncclGroupStart/End avoids in torch.distributed.pipelining), and
// NCCL's in-order matching holds because every schedule receives a pair's messages in the
// order they were sent (checked at start: sends_and_receives_in_same_order). Shapes travel once,
// through the store, the first time a (kind, stage, micro-batch) is sent; later steps reuse them.
// The host never blocks on a transfer: the receiver's compute stream waits on an event. So that
// a peer alive but stuck (its heartbeat goes on, its half of a transfer never comes) cannot hang
// this rank in a device synchronisation, a watchdog thread waits for each posted transfer as a
// Gloo receive waits (PeerDeadline: pushed on while the peer beats, at most 10 x the timeout),
// then announces the failure and aborts, which ends the spinning NCCL kernels.
// Communication streams are classed "communication" for the Orion shim when it is loaded.
#include <fmt/format.h>

#include "cross_process_transport.h"
#include "trainer/distributed/gpu_sharing.h"
#include "trainer/config/config.h"
#include "trainer/partition/placement.h"

#ifdef OURGPIPE_HAVE_NCCL
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <list>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "orion.h"
#include "trainer/device/device.h"
#include "trainer/log/engine_log.h"
#endif

namespace gpipe {

std::string nccl_id_store_key(const Placement& placement, int from_rank, int to_rank) {
  return fmt::format("nccl/id/{}/{}/{}/{}", placement.process_of(from_rank), placement.process_of(to_rank), from_rank,
                     to_rank);
}

std::string nccl_shape_store_key(const Placement& placement, const TransferKey& key, int sender_rank) {
  return fmt::format("nccl/shape/{}/{}/{}/{}", placement.process_of(sender_rank), static_cast<int>(key.kind),
                     key.stage, key.microbatch);
}

#ifndef OURGPIPE_HAVE_NCCL

std::unique_ptr<Transport> make_nccl_process_transport(Distributed::Impl&, const Placement&, const Schedule&) {
  throw ConfigError("parallel.transport=nccl: this build has no NCCL (configure on a machine with the CUDA toolkit and "
                    "LibTorch-CUDA); use gloo for CPU stages");
}

#else

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default: throw TransportError(std::string("the nccl transport cannot carry dtype ") + c10::toString(t));
  }
}

class NcclReadyEvent final : public ReadyEvent {
 public:
  explicit NcclReadyEvent(const c10::cuda::CUDAStream& stream) { event_.record(stream); }
  void block_current_stream() const override {
    const_cast<at::cuda::CUDAEvent&>(event_).block(c10::cuda::getCurrentCUDAStream());
  }
  bool reached() const override { return event_.query(); }

 private:
  at::cuda::CUDAEvent event_;
};

// One direction between two pipeline ranks. `mu` guards `comm`: the rank's thread holds it for
// each call, abort() (monitor or executor thread) takes it to abort and clear the communicator.
struct Channel {
  ncclComm_t comm = nullptr;
  cudaStream_t raw_stream = nullptr;  // its own stream, never one of the pool's (compute uses those)
  std::optional<c10::cuda::CUDAStream> stream;
  int peer_index = 0;  // the other end's rank in the two-rank communicator
  std::mutex mu;
};

class NcclProcessTransport final : public CrossProcessTransport {
 public:
  NcclProcessTransport(Distributed::Impl& dist, const Placement& placement, const Schedule& schedule)
      : CrossProcessTransport(dist, placement, schedule), device_(c10::cuda::current_device()) {
    if (std::string why; !sends_and_receives_in_same_order(schedule, placement, &why)) {
      throw ConfigError("parallel.transport=nccl matches messages in the order they are posted, but " + why +
                        "; use parallel.transport gloo or another schedule");
    }
    // Every process walks the same sorted list of pairs, so the blocking two-rank initialisations
    // happen in one global order and cannot wait on each other in a cycle.
    const std::set<std::pair<int, int>> pairs = sending_rank_pairs(schedule);  // gpu_sharing.h checks these too
    try {
      for (const auto& [from, to] : pairs) {
        const int p_from = placement_.process_of(from), p_to = placement_.process_of(to);
        if (p_from == p_to || (p_from != dist_.world.rank && p_to != dist_.world.rank)) continue;
        channels_[{from, to}] = open_channel(from, to, p_from == dist_.world.rank);
      }
    } catch (...) {
      for (auto& [pair, channel] : channels_) close_channel(*channel);  // no destructor runs
      throw;
    }
    if (!channels_.empty()) watchdog_ = std::thread([this] { watch_posted(); });
  }

  ~NcclProcessTransport() override {
    {
      std::lock_guard<std::mutex> lock(posted_mu_);
      watchdog_stop_ = true;
    }
    watchdog_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    // Abort, never destroy: ncclCommDestroy may wait for a peer that is still running (this
    // process is unwinding from an error) and the step's work was synchronised before a normal end.
    for (auto& [pair, channel] : channels_) close_channel(*channel);
  }

  // The communicators are gone after an abort: only the in-memory mailbox can be reset, and the
  // failed step's transfers are no longer watched.
  size_t reset() override {
    {
      std::lock_guard<std::mutex> lock(posted_mu_);
      posted_.clear();
    }
    return local_->reset();
  }

 private:
  void send_remote(const TransferKey& key, Message message, int to) override {
    Channel& ch = channel(rank_of(key.sender_stage()), to);
    at::Tensor data = message.tensor.detach();
    if (!data.is_cuda()) throw TransportError("the nccl transport carries CUDA tensors; " + to_string(key) + " is on the CPU");
    std::lock_guard<std::mutex> lock(ch.mu);
    if (ch.comm == nullptr) check_not_aborted("send of " + to_string(key));
    c10::cuda::CUDAStreamGuard guard(*ch.stream);
    if (message.ready) message.ready->block_current_stream();
    data = data.contiguous();
    publish_shape(key, data);
    check(ncclSend(data.data_ptr(), static_cast<size_t>(data.numel()), nccl_type(data.scalar_type()), ch.peer_index,
                   ch.comm, ch.stream->stream()), ch, "ncclSend of " + to_string(key));
    // The producer's memory must not be reused before the communication stream has read it.
    c10::cuda::CUDACachingAllocator::recordStream(data.storage().data_ptr(), *ch.stream);
    bytes_sent_ += static_cast<uint64_t>(data.nbytes());
    watch(std::make_shared<NcclReadyEvent>(*ch.stream), "ncclSend of " + to_string(key), placement_.process_of(to));
  }

  bool remote_recv_waits_on_host() const override { return false; }

  Message recv_remote(const TransferKey& key, std::chrono::milliseconds, int from) override {
    // The wait is stream-ordered: the consumer's stream waits on the event; nothing blocks here.
    Channel& ch = channel(from, rank_of(key.stage));
    const auto [dtype, shape] = shape_of(key);
    std::lock_guard<std::mutex> lock(ch.mu);
    if (ch.comm == nullptr) check_not_aborted("recv of " + to_string(key));
    c10::cuda::CUDAStreamGuard guard(*ch.stream);
    at::Tensor data = at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kCUDA, device_));
    check(ncclRecv(data.data_ptr(), static_cast<size_t>(data.numel()), nccl_type(dtype), ch.peer_index, ch.comm,
                   ch.stream->stream()), ch, "ncclRecv of " + to_string(key));
    auto received = std::make_shared<NcclReadyEvent>(*ch.stream);
    watch(received, "ncclRecv of " + to_string(key), placement_.process_of(from));
    return Message{data, std::move(received)};
  }

  // A transfer posted on a channel's stream, done once `done` is reached (the peer took part).
  struct Posted {
    std::shared_ptr<const ReadyEvent> done;
    std::string what;
    int peer_process;
    PeerDeadline deadline;
  };

  void watch(std::shared_ptr<const ReadyEvent> done, std::string what, int peer_process) {
    std::lock_guard<std::mutex> lock(posted_mu_);
    posted_.push_back(Posted{std::move(done), std::move(what), peer_process, PeerDeadline(dist_, peer_process)});
  }

  // The watchdog: once per heartbeat period, forgets the transfers done and gives up on the first
  // whose deadline passed. Its store reads and event queries happen outside posted_mu_ (a send
  // appends under its channel's lock); what is still pending goes back ahead of newer posts.
  void watch_posted() {
    c10::cuda::CUDAGuard device_guard(device_);
    std::unique_lock<std::mutex> lock(posted_mu_);
    while (!watchdog_stop_) {
      watchdog_cv_.wait_for(lock, dist_.options.heartbeat, [this] { return watchdog_stop_; });
      if (watchdog_stop_ || posted_.empty()) continue;
      std::list<Posted> looking;
      looking.splice(looking.begin(), posted_);
      lock.unlock();
      std::string stuck;
      try {
        for (auto it = looking.begin(); it != looking.end() && stuck.empty();) {
          if (it->done->reached()) {
            it = looking.erase(it);
          } else if (it->deadline.passed()) {
            stuck = fmt::format("{} did not complete within {} ms{}", it->what, dist_.options.timeout.count(),
                                it->deadline.why());
          } else {
            ++it;
          }
        }
      } catch (const std::exception& e) {
        stuck = "watching the NCCL transfers failed: " + error_text(e);
      }
      if (!stuck.empty()) {
        looking.clear();
        engine_log_warn("nccl transport: " + stuck + "; aborting");
        try {
          // Where the other ranks look (as the monitor announces a lost rank): the stuck peer
          // aborts its own transfers too.
          const std::string why = fmt::format("rank {}: {}", dist_.world.rank, stuck);
          dist_.store->compareSet("abort", {}, std::vector<uint8_t>(why.begin(), why.end()));
        } catch (const std::exception&) {
          // the store is gone: each rank reports its own view
        }
        dist_.fail(stuck);  // aborts this transport: the waiting NCCL kernels end
        return;             // nothing is posted after an abort (check_not_aborted)
      }
      lock.lock();
      posted_.splice(posted_.begin(), looking);
    }
  }

  void abort_remote() override {
    abort_requested_ = true;  // a thread polling in check() lets go of its channel
    // Kernels waiting for a dead peer only stop when their communicator is aborted.
    for (auto& [pair, channel] : channels_) {
      std::lock_guard<std::mutex> lock(channel->mu);
      if (channel->comm != nullptr) ncclCommAbort(channel->comm);
      channel->comm = nullptr;
    }
  }

  Channel& channel(int from, int to) {
    auto it = channels_.find({from, to});
    if (it == channels_.end()) {
      throw TransportError(fmt::format("no NCCL channel from pipeline rank {} to {}: the schedule sends a message its "
                                       "start-up scan did not see", from, to));
    }
    return *it->second;
  }

  std::string key_name(const TransferKey& key) const {
    return nccl_shape_store_key(placement_, key, rank_of(key.sender_stage()));
  }

  void publish_shape(const TransferKey& key, const at::Tensor& t) {
    std::string text = std::to_string(static_cast<int>(t.scalar_type()));
    for (int64_t d : t.sizes()) text += "," + std::to_string(d);
    {
      std::lock_guard<std::mutex> lock(shapes_mu_);
      auto [it, first] = published_.emplace(key, text);
      if (!first) {
        // The receiver allocates from the first step's shape: a different one would be a wrong count.
        if (it->second != text) {
          throw TransportError(fmt::format("the {} changed shape or dtype ({} -> {}); the nccl transport needs the same "
                                           "shapes every step", to_string(key), it->second, text));
        }
        return;
      }
    }
    dist_.store->set(key_name(key), std::vector<uint8_t>(text.begin(), text.end()));
  }

  std::pair<at::ScalarType, std::vector<int64_t>> shape_of(const TransferKey& key) {
    {
      std::lock_guard<std::mutex> lock(shapes_mu_);
      if (auto it = shapes_.find(key); it != shapes_.end()) return it->second;
    }
    std::string raw;
    try {
      // The sender's process is named: while it beats (alive but slow) the wait goes on past the
      // timeout, as a Gloo receive's does.
      raw = dist_.wait_for_key(key_name(key), "the shape of the " + to_string(key),
                               placement_.process_of(rank_of(key.sender_stage())));
    } catch (const std::exception& e) {
      check_not_aborted("recv of " + to_string(key));
      throw TransportTimeout(fmt::format("the shape of the {} never arrived from pipeline rank {}: {}", to_string(key),
                                         rank_of(key.sender_stage()), e.what()));
    }
    std::stringstream in(raw);
    std::string field;
    std::getline(in, field, ',');
    std::pair<at::ScalarType, std::vector<int64_t>> result{static_cast<at::ScalarType>(std::stoi(field)), {}};
    while (std::getline(in, field, ',')) result.second.push_back(std::stoll(field));
    std::lock_guard<std::mutex> lock(shapes_mu_);
    shapes_[key] = result;
    return result;
  }

  // Non-blocking NCCL: calls may return ncclInProgress; wait until the communicator settles, up
  // to the peer timeout, so a dead peer is an error and not a hang.
  void check(ncclResult_t result, Channel& ch, const std::string& what) {
    const auto deadline = Clock::now() + dist_.options.timeout;
    // Called with ch.mu held (or before the channel is shared); abort() waits for it.
    while (result == ncclInProgress) {
      if (abort_requested_) break;
      if (Clock::now() > deadline) {
        throw TransportTimeout(fmt::format("{} did not complete within {} ms", what, dist_.options.timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (const ncclResult_t query = ncclCommGetAsyncError(ch.comm, &result); query != ncclSuccess) result = query;
    }
    if (result != ncclSuccess) {
      check_not_aborted(what);
      throw TransportError(fmt::format("{} failed: {} ({})", what, ncclGetErrorString(result),
                                       ch.comm ? ncclGetLastError(ch.comm) : ""));
    }
  }

  std::unique_ptr<Channel> open_channel(int from, int to, bool sender) {
    auto ch = std::make_unique<Channel>();
    const std::string key = nccl_id_store_key(placement_, from, to);
    ncclUniqueId id;
    if (sender) {
      ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) throw TransportError(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
      dist_.store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      const std::string raw = dist_.wait_for_key(key, fmt::format("the NCCL id of pipeline ranks {} -> {}", from, to),
                                                 placement_.process_of(from));
      if (raw.size() != sizeof(id.internal)) throw TransportError("a malformed NCCL id arrived for " + key);
      std::copy(raw.begin(), raw.end(), id.internal);
    }
    c10::cuda::CUDAGuard device_guard(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&ch->comm, 2, id, sender ? 0 : 1, &config);
    ch->peer_index = sender ? 1 : 0;
    // A failure from here on must not leak the half-built communicator.
    struct CloseOnError {
      NcclProcessTransport* self;
      Channel* ch;
      bool armed = true;
      ~CloseOnError() { if (armed) self->close_channel(*ch); }
    } guard{this, ch.get()};
    check(r, *ch, fmt::format("NCCL communicator between pipeline ranks {} and {} (rank {} and rank {})", from, to,
                              placement_.process_of(from), placement_.process_of(to)));
    int least = 0, greatest = 0;
    C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    C10_CUDA_CHECK(cudaStreamCreateWithPriority(&ch->raw_stream, cudaStreamNonBlocking, greatest));
    ch->stream = c10::cuda::getStreamFromExternal(ch->raw_stream, device_);
    // Tell the Orion shim (when preloaded) that this stream carries communication: never deferred.
    if (auto set_class = reinterpret_cast<orion_set_stream_class_fn>(dlsym(RTLD_DEFAULT, "orion_set_stream_class"))) {
      set_class(static_cast<void*>(ch->raw_stream), "communication");
    }
    // NCCL connects point-to-point peers lazily, at the first send/receive, and that needs both
    // ends: connect now, in the global pair order every process walks, so that the first send of
    // a step can never wait for a peer that is itself blocked in its own first send.
    at::Tensor probe = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
    const std::string what = fmt::format("connecting pipeline ranks {} -> {}", from, to);
    check(sender ? ncclSend(probe.data_ptr(), 1, ncclFloat32, ch->peer_index, ch->comm, ch->raw_stream)
                 : ncclRecv(probe.data_ptr(), 1, ncclFloat32, ch->peer_index, ch->comm, ch->raw_stream),
          *ch, what);
    wait_for_probe(*ch, what, placement_.process_of(sender ? to : from));
    guard.armed = false;
    return ch;
  }

  // The probe's kernel spins until the peer's half runs: cudaStreamSynchronize would wait for
  // ever on a peer that died meanwhile (this runs before the monitor watches the transport).
  // Poll instead: the communicator's asynchronous error, a failure the monitor learnt of (a lost
  // or announcing rank), and the peer timeout, which a live peer's heartbeat extends as for the
  // NCCL id. Throwing leaves the kernel to the caller's guard, whose ncclCommAbort stops it.
  void wait_for_probe(Channel& ch, const std::string& what, int peer_process) {
    PeerDeadline deadline(dist_, peer_process);
    while (!ch.stream->query()) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(ch.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
        throw TransportError(fmt::format("{} failed: {} ({})", what, ncclGetErrorString(async), ncclGetLastError(ch.comm)));
      }
      try {
        dist_.throw_if_failed();
      } catch (const std::runtime_error& e) {
        throw TransportError(what + " aborted: " + e.what());
      }
      check_not_aborted(what);
      bool passed = false;
      try {
        passed = deadline.passed();  // reads the peer's heartbeat in the store
      } catch (const std::exception& e) {
        throw TransportError(fmt::format("{}: lost the rendezvous store while waiting for rank {} ({})", what,
                                         peer_process, error_text(e)));
      }
      if (passed) {
        throw TransportTimeout(fmt::format("{}: rank {} did not take the first message within {} ms{}", what,
                                           peer_process, dist_.options.timeout.count(), deadline.why()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void close_channel(Channel& ch) {
    std::lock_guard<std::mutex> lock(ch.mu);
    if (ch.comm != nullptr) ncclCommAbort(ch.comm);
    ch.comm = nullptr;
    if (ch.raw_stream != nullptr) cudaStreamDestroy(ch.raw_stream);
    ch.raw_stream = nullptr;
  }

  c10::DeviceIndex device_;
  std::map<std::pair<int, int>, std::unique_ptr<Channel>> channels_;
  std::mutex posted_mu_;
  std::condition_variable watchdog_cv_;
  bool watchdog_stop_ = false;   // guarded by posted_mu_
  std::list<Posted> posted_;     // guarded by posted_mu_; oldest first
  std::thread watchdog_;         // started once the channels are open
  std::atomic<bool> abort_requested_{false};
  std::mutex shapes_mu_;
  std::map<TransferKey, std::string> published_;  // the shape each key was first sent with
  std::map<TransferKey, std::pair<at::ScalarType, std::vector<int64_t>>> shapes_;
};

}  // namespace

std::unique_ptr<Transport> make_nccl_process_transport(Distributed::Impl& dist, const Placement& placement,
                                                       const Schedule& schedule) {
  return std::make_unique<NcclProcessTransport>(dist, placement, schedule);
}

#endif

}  // namespace gpipe
