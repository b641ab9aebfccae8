// Distributed: the c10d rendezvous, the Gloo process group and the peer monitor (distributed.h).
#include "trainer/distributed/distributed.h"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>

#include <fmt/format.h>

#include "distributed_internal.h"
#include "trainer/config/config.h"
#include "trainer/log/engine_log.h"
#include "trainer/distributed/transport.h"

namespace gpipe {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

bool mentions(const std::string& haystack, std::initializer_list<const char*> needles) {
  for (const char* n : needles) {
    if (haystack.find(n) != std::string::npos) return true;
  }
  return false;
}

std::string seconds(std::chrono::milliseconds ms) { return fmt::format("{:g} s", ms.count() / 1000.0); }

c10::intrusive_ptr<c10d::Store> open_store(const WorldInfo& world, const DistributedOptions& options, bool server) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(world.master_port);
  o.isServer = server;
  o.waitWorkers = false;  // joining is checked below, naming the ranks that are missing
  o.timeout = options.timeout;
  auto tcp = c10::make_intrusive<c10d::TCPStore>(world.master_addr, o);
  // torchrun's agent store is shared with the agent: workers live under its attempt prefix.
  const std::string prefix = (world.agent_store ? world.store_prefix + "/" : std::string()) + "gpipe";
  return c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout;
  if (const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME"); ifnames != nullptr && *ifnames != '\0') {
    std::stringstream list(ifnames);
    for (std::string name; std::getline(list, name, ',');) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    }
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}

void Distributed::Impl::fail(const std::string& reason) {
  // From here on the peers' sockets close one by one; c10d would log each with a backtrace.
  FLAGS_caffe2_log_level = 2;  // errors only
  std::vector<c10::intrusive_ptr<c10d::Backend>> groups;
  {
    // Under the lock, so that unwatch() (before a transport is destroyed) waits for us; no
    // transport's abort() takes this lock.
    std::lock_guard<std::mutex> lock(mu);
    if (!failure) failure = reason;
    for (Transport* t : watched) {
      try {
        t->abort(*failure);
      } catch (const std::exception& e) {
        engine_log_warn("aborting a transport failed: " + error_text(e));
      }
    }
    for (auto& weak : nccl_groups) {
      if (auto group = weak.lock()) groups.push_back(std::move(group));
    }
  }
  // Outside the lock: ProcessGroupNCCL::abort waits (up to its timeout) for its communicators to
  // abort, and every wait of ours polls under `mu`.
  for (auto& group : groups) {
    try {
      group->abort();
    } catch (const std::exception& e) {
      engine_log_warn("aborting an NCCL process group failed: " + error_text(e));
    }
  }
}

void Distributed::Impl::monitor_loop() {
  const int me = world.rank;
  std::map<int, int64_t> last_value;
  std::map<int, Clock::time_point> last_change;
  for (int k = 0; k < world.world_size; ++k) last_change[k] = Clock::now();
  bool acknowledged = false;
  bool failed = false;
  std::unique_lock<std::mutex> lock(mu);
  while (!stop) {
    lock.unlock();
    try {
      // Beats go on after a failure until the process exits: the other ranks tell a live rank
      // from a lost one by its beats (explain_collective_failure).
      monitor_store->add("hb/" + std::to_string(me), 1);
      if (!acknowledged && monitor_store->check({"abort"})) {
        // Abort our transport before acknowledging: the announcing rank exits once everyone
        // acknowledged, and our receives from it must fail with its reason, not "lost rank".
        fail(text(monitor_store->get("abort")));
        monitor_store->add("abort_seen", 1);
        acknowledged = failed = true;
      }
      for (int k = 0; k < world.world_size && !failed; ++k) {
        if (k == me) continue;
        const int64_t value = monitor_store->add("hb/" + std::to_string(k), 0);
        if (value != last_value[k]) {
          last_value[k] = value;
          last_change[k] = Clock::now();
        } else if (Clock::now() - last_change[k] > options.timeout) {
          const std::string lost = fmt::format("lost rank {}: no heartbeat for {} (killed, crashed or hung; "
                                               "parallel.peer_timeout_s sets this limit)", k, seconds(options.timeout));
          monitor_store->compareSet("abort", {}, bytes(fmt::format("rank {}: {}", me, lost)));
          fail(lost);
          failed = true;
        }
      }
    } catch (const std::exception& e) {
      fail(fmt::format("lost the rendezvous store at {} that rank 0 hosts: rank 0 exited or its host is unreachable "
                       "({})", store_address, error_text(e)));
      lock.lock();
      break;
    }
    lock.lock();
    cv.wait_for(lock, options.heartbeat, [&] { return stop; });
  }
}

Distributed::Distributed(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Distributed::~Distributed() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->monitor.joinable()) impl_->monitor.join();
}

std::unique_ptr<Distributed> Distributed::connect(const WorldInfo& world, const std::string& config_hash,
                                                  DistributedOptions options) {
  // c10d logs every socket a dying peer closes as a warning with a C++ backtrace; our errors name
  // the lost rank in one line instead.
  FLAGS_caffe2_log_level = 2;
  // NCCL process groups are made non-blocking (new_group): their communicator set-up is then
  // bounded by TORCH_NCCL_NONBLOCKING_TIMEOUT, 30 minutes unless set; ours is peer_timeout_s.
  // Set here, on the main thread, before any thread of ours or c10d's reads the environment.
  static std::once_flag nccl_timeout_set;  // one process, one connect (tests make two at once)
  std::call_once(nccl_timeout_set, [&] {
    if (const char* set = std::getenv("TORCH_NCCL_NONBLOCKING_TIMEOUT"); set == nullptr || *set == '\0') {
      const auto secs = std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::seconds>(options.timeout).count());
      ::setenv("TORCH_NCCL_NONBLOCKING_TIMEOUT", std::to_string(secs).c_str(), 1);
    }
  });
  auto impl = std::make_unique<Impl>();
  impl->world = world;
  impl->options = options;
  impl->store_address = fmt::format("{}:{}", world.master_addr, world.master_port);
  const bool server = world.rank == 0 && !world.agent_store;
  try {
    impl->store = open_store(world, options, server);
    impl->monitor_store = open_store(world, options, false);
  } catch (const std::exception& e) {
    const std::string what = error_text(e);
    if (server && mentions(what, {"EADDRINUSE", "already in use", "address in use"})) {
      throw RendezvousError(fmt::format(
          "MASTER_PORT={} is already in use on {} (another job or a leftover process holds it): rank 0 cannot host "
          "the rendezvous there; pick a free port (MASTER_PORT=..., torchrun --master_port, gpipe_runner "
          "--master-port)", world.master_port, world.master_addr));
    }
    if (server) {
      throw RendezvousError(fmt::format("rank 0 could not host the rendezvous on {}: {}", impl->store_address, what));
    }
    throw RendezvousError(fmt::format(
        "rank {} could not reach the rendezvous at {} within {} (rank 0 hosts it): check MASTER_ADDR and "
        "MASTER_PORT, that rank 0 started, and that the port is reachable from this host ({})",
        world.rank, impl->store_address, seconds(options.timeout), what));
  }
  auto& store = *impl->store;
  const std::string me = std::to_string(world.rank);
  // Why this rank gives up, posted where the others look ("abort") before it throws: they report
  // it instead of a lost store or a Gloo connect that times out.
  // `config`: a verdict about the ranks' configuration (exit 2 on every rank), posted as such so
  // that a rank still waiting for the others to join reports it as one too.
  auto give_up = [&](const std::string& why, bool config = false) {
    try {
      if (config) store.set("abort_is_config", bytes("1"));
      store.compareSet("abort", {}, bytes(why));
    } catch (const std::exception&) {
      // the store is gone already: each rank reports its own view
    }
    if (world.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the others read it
  };
  // Each rank claims its number once: a second process with the same RANK (a script exporting
  // RANK, two steps sharing a port) would count as a join and overwrite the first one's hash.
  const std::string claim = fmt::format("{}:{}", this_host_name(), ::getpid());
  const std::string holder = text(store.compareSet("joined/" + me, {}, bytes(claim)));
  if (holder != claim) {
    const std::string why = fmt::format(
        "two processes were started as rank {} of {} ({} and {}, host:pid): each process needs its own rank; check "
        "that RANK / SLURM_PROCID is not exported by the job script and that two jobs do not share MASTER_ADDR:"
        "MASTER_PORT ({})", world.rank, world.world_size, holder, claim, impl->store_address);
    give_up(why, /*config=*/true);
    throw ConfigError(why);
  }
  store.add("hb/" + me, 1);
  store.set("config_hash/" + me, bytes(config_hash));
  store.add("joined", 1);
  // Same config everywhere: a rank started with another file or --set would train a different
  // model silently. Each rank compares with rank 0 as soon as it has joined (rank 0 posted its
  // hash first thing), rank 0 with everyone once all joined; both sides exit with the message.
  auto check_hash = [&](int k) {
    const std::string other = text(store.get("config_hash/" + std::to_string(k)));
    if (other == config_hash) return;
    const int a = std::min(world.rank, k), b = std::max(world.rank, k);
    throw ConfigError(fmt::format(
        "rank {} and rank {} run different configurations (config hash {} vs {}): give every rank the same "
        "--config file and the same --set overrides, and every node the same parallel.schedule_file and "
        "dataset.tokenizer_model contents", a, b, a == world.rank ? config_hash : other,
        a == world.rank ? other : config_hash));
  };
  const auto deadline = Clock::now() + options.timeout;
  // Polls the store every 20 ms until `done()`. The first rank to give up posts why; the others
  // report that (as a configuration verdict when it was posted as one) rather than a lost store.
  // `phase` names the wait in a lost store's message; past the deadline `timed_out()` throws.
  auto wait_in_store = [&](const std::function<bool()>& done, const char* phase,
                           const std::function<void()>& timed_out) {
    while (true) {
      bool finished = false;
      try {
        if (store.check({"abort"})) {
          const std::string why = text(store.get("abort"));
          if (store.check({"abort_is_config"})) throw ConfigError(why);
          throw RendezvousError(why);
        }
        finished = done();
      } catch (const RendezvousError&) {
        throw;
      } catch (const ConfigError&) {
        throw;
      } catch (const std::exception& e) {
        throw RendezvousError(fmt::format("rank {} lost the rendezvous store at {} (rank 0 hosts it) while {}: rank 0 "
                                          "gave up or died (see its log): {}", world.rank, impl->store_address, phase,
                                          error_text(e)));
      }
      if (finished) return;
      if (Clock::now() > deadline) {
        timed_out();
        throw RendezvousError(fmt::format("rank {} timed out while {}", world.rank, phase));  // timed_out() throws first
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  if (world.rank != 0) {
    // Polled, not a blocking get: under torchrun's agent store rank 0 may never come, and its
    // posted reason (or the missing rank) is what this rank should say.
    wait_in_store([&] { return store.check({"config_hash/0"}); }, "waiting for rank 0 to join", [&] {
      const std::string why = fmt::format(
          "rank 0 did not join the rendezvous at {} within {}; missing rank 0 (not started, failed at start, or "
          "launched with another MASTER_ADDR/MASTER_PORT or WORLD_SIZE)", impl->store_address, seconds(options.timeout));
      give_up(why);
      throw RendezvousError(why);
    });
    check_hash(0);
  }
  const std::string join_phase = fmt::format("waiting for all {} ranks to join", world.world_size);
  wait_in_store([&] { return store.add("joined", 0) >= world.world_size; }, join_phase.c_str(), [&] {
    std::string missing;
    int count = 0;
    for (int k = 0; k < world.world_size; ++k) {
      if (!store.check({"joined/" + std::to_string(k)})) {
        missing += (count++ ? ", " : "") + std::to_string(k);
      }
    }
    const std::string why = fmt::format(
        "only {} of {} ranks joined the rendezvous at {} within {}; missing rank{} {} (not started, failed at "
        "start, or launched with another MASTER_ADDR/MASTER_PORT or WORLD_SIZE; under SLURM run the job "
        "with srun)", world.world_size - count, world.world_size, impl->store_address, seconds(options.timeout),
        count > 1 ? "s" : "", missing);
    give_up(why);
    throw RendezvousError(why);
  });
  // Rank 0 compares every hash and posts the verdict; the others wait for it before connecting
  // Gloo, so with 3 or more ranks a rank that matches rank 0 hears about the one that does not
  // instead of timing out in the Gloo connect.
  if (world.rank == 0) {
    try {
      for (int k = 1; k < world.world_size; ++k) check_hash(k);
    } catch (const ConfigError& e) {
      give_up(e.what(), /*config=*/true);
      throw;
    }
    store.set("hashes_agree", bytes("1"));
  } else {
    wait_in_store([&] { return store.check({"hashes_agree"}); }, "rank 0 compared the configurations", [&] {
      throw RendezvousError(fmt::format("rank {} waited {} for rank 0 to compare the ranks' configurations at {}: "
                                        "rank 0 is stuck or died (see its log)", world.rank, seconds(options.timeout),
                                        impl->store_address));
    });
  }
  try {
    impl->gloo = make_gloo_backend(c10::make_intrusive<c10d::PrefixStore>("gloo", impl->store), world.rank,
                                   world.world_size, options.timeout);
    std::vector<int> everyone(static_cast<size_t>(world.world_size));
    std::iota(everyone.begin(), everyone.end(), 0);
    impl->world_group = make_process_group(*impl, "world", "gloo", world.rank, std::move(everyone), impl->gloo);
  } catch (const std::exception& e) {
    throw RendezvousError(fmt::format("rank {} could not connect its Gloo process group to the other ranks: {} "
                                      "(GLOO_SOCKET_IFNAME picks the network interface)", world.rank, error_text(e)));
  }
  Impl* raw = impl.get();
  impl->monitor = std::thread([raw] { raw->monitor_loop(); });
  return std::unique_ptr<Distributed>(new Distributed(std::move(impl)));
}

int Distributed::rank() const { return impl_->world.rank; }
int Distributed::world_size() const { return impl_->world.world_size; }
const WorldInfo& Distributed::world() const { return impl_->world; }
std::chrono::milliseconds Distributed::timeout() const { return impl_->options.timeout; }

std::string Distributed::Impl::explain_collective_failure(const std::string& what, const std::exception& error) {
  // A collective names no peer when a socket closes. Every live rank keeps beating (the
  // monitor), so a rank whose beats stop over three periods is the lost one; an announcement
  // from another rank, if one comes meanwhile, says more.
  auto beats = [&] {
    std::vector<int64_t> v;
    for (int k = 0; k < world.world_size; ++k) v.push_back(store->add("hb/" + std::to_string(k), 0));
    return v;
  };
  try {
    const auto before = beats();
    const auto until = Clock::now() + 3 * options.heartbeat + std::chrono::milliseconds(200);
    while (Clock::now() < until) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (failure) return *failure;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const auto after = beats();
    std::string lost;
    for (int k = 0; k < world.world_size; ++k) {
      if (k != world.rank && after[static_cast<size_t>(k)] == before[static_cast<size_t>(k)]) {
        lost += (lost.empty() ? "" : ", ") + std::to_string(k);
      }
    }
    if (!lost.empty()) {
      return fmt::format("lost rank {}: its heartbeat stopped while the ranks ran a {} ({})", lost, what,
                         error_text(error));
    }
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failure) return *failure;
    }
    return fmt::format("lost the rendezvous store at {} that rank 0 hosts during a {}: rank 0 exited ({}; {})",
                       store_address, what, error_text(error), error_text(e));
  }
  return fmt::format("{} across ranks failed: {}", what, error_text(error));
}

void Distributed::Impl::wait_collective(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what) {
  // Gloo collectives cannot be aborted: poll, so a failure the monitor learns of (a rank that
  // announced, a silent peer) ends the wait at once instead of after the full timeout.
  const auto deadline = Clock::now() + options.timeout;
  try {
    while (!work->isCompleted()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (failure) throw std::runtime_error(*failure);
      }
      if (Clock::now() > deadline) {
        throw std::runtime_error(fmt::format("timed out after {}", seconds(options.timeout)));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    work->wait();
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failure) throw std::runtime_error(*failure);
    }
    throw std::runtime_error(explain_collective_failure(what, e));
  }
}

std::vector<double> Distributed::all_reduce_sum(std::vector<double> values) {
  return impl_->world_group->all_reduce_sum(std::move(values));
}

void Distributed::all_reduce_sum_in_place(at::Tensor& tensor) { impl_->world_group->all_reduce_sum_in_place(tensor); }

void Distributed::barrier() {
  impl_->wait_collective(impl_->gloo->barrier(), "barrier");
}

PeerDeadline::PeerDeadline(Distributed::Impl& dist, std::optional<int> peer)
    : dist_(dist), peer_(peer), deadline_(Clock::now() + capped(dist.options.timeout)),
      hard_deadline_(Clock::now() + kLiveWaits * capped(dist.options.timeout)), next_look_(Clock::now()) {}

std::chrono::milliseconds PeerDeadline::capped(std::chrono::milliseconds timeout) {
  // A year: far past any real wait, and 10 x it stays far inside the clock's range.
  return std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 365)));
}

bool PeerDeadline::passed() {
  if (peer_ && Clock::now() > next_look_) {
    // The peer's monitor thread beats while its main thread works: still alive, wait on.
    const int64_t beat = dist_.store->add("hb/" + std::to_string(*peer_), 0);
    if (last_beat_ >= 0 && beat != last_beat_) deadline_ = std::min(Clock::now() + capped(dist_.options.timeout), hard_deadline_);
    last_beat_ = beat;
    next_look_ = Clock::now() + dist_.options.heartbeat;
  }
  return Clock::now() > deadline_;
}

std::string PeerDeadline::why() const {
  if (!peer_) return {};
  if (Clock::now() >= hard_deadline_) {
    return fmt::format(" ({} x parallel.peer_timeout_s in all: rank {} is alive but does not get there)", kLiveWaits,
                       *peer_);
  }
  return fmt::format(" after rank {}'s heartbeat stopped", *peer_);
}

void Distributed::Impl::throw_if_failed() {
  std::lock_guard<std::mutex> lock(mu);
  if (failure) throw std::runtime_error(*failure);
}

std::string Distributed::Impl::wait_for_key(const std::string& key, const std::string& what,
                                            std::optional<int> writer) {
  // Polled, not a blocking get: a blocking get can be neither interrupted when the monitor learns
  // that the rank who should write `key` is gone, nor shared (TCPStore holds its client lock).
  PeerDeadline deadline(*this, writer);
  try {
    while (!store->check({key})) {
      throw_if_failed();
      if (deadline.passed()) {
        throw std::runtime_error(fmt::format("{} did not arrive within {}{}", what, seconds(options.timeout),
                                             deadline.why()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return text(store->get(key));
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::exception& e) {
    throw_if_failed();  // the store went with a dead peer: the monitor's account says which
    throw std::runtime_error(fmt::format("waiting for {}: {}", what, error_text(e)));
  }
}

std::string Distributed::broadcast_from_rank0(const std::string& name, const std::string& value) {
  const std::string key = "bcast/" + name;
  if (rank() == 0) {
    impl_->store->set(key, bytes(value));
    return value;
  }
  return impl_->wait_for_key(key, "rank 0's " + name, 0);
}

std::vector<std::string> Distributed::gather_to_rank0(const std::string& name, const std::string& value) {
  const std::string prefix = "gather/" + name + "/";
  impl_->store->set(prefix + std::to_string(rank()), bytes(value));
  std::vector<std::string> all;
  if (rank() != 0) return all;
  for (int k = 0; k < world_size(); ++k) {
    all.push_back(impl_->wait_for_key(prefix + std::to_string(k), fmt::format("rank {}'s {}", k, name), k));
  }
  return all;
}

std::unique_ptr<Transport> Distributed::make_transport(const std::string& kind, const Placement& placement,
                                                       const Schedule& schedule) {
  std::unique_ptr<Transport> transport;
  if (kind == "gloo") {
    transport = make_gloo_process_transport(*impl_, placement, schedule);
  } else if (kind == "nccl") {
    transport = make_nccl_process_transport(*impl_, placement, schedule);
  } else {
    throw ConfigError("parallel.transport='" + kind + "' cannot connect processes: use gloo (CPU) or nccl (CUDA)");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->watched.insert(transport.get());
  if (impl_->failure) transport->abort(*impl_->failure);
  return transport;
}

void Distributed::unwatch(Transport* transport) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->watched.erase(transport);
}

void Distributed::announce_failure(const std::string& reason) {
  FLAGS_caffe2_log_level = 2;  // see Impl::fail
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->announced) return;
    impl_->announced = true;
  }
  try {
    impl_->store->compareSet("abort", {}, bytes(fmt::format("rank {}: {}", rank(), reason)));
    // The others read it within a heartbeat; rank 0 must not take the store down before.
    const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(impl_->options.timeout, std::chrono::seconds(5));
    while (impl_->store->add("abort_seen", 0) < world_size() - 1 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Rank 0 hosts the store: the others may still be telling a lost rank from a live one by its
    // heartbeats (explain_collective_failure); keep the store up until they are done.
    if (rank() == 0) std::this_thread::sleep_for(3 * impl_->options.heartbeat + std::chrono::seconds(1));
  } catch (const std::exception&) {
    // The store is gone (rank 0 died first): the others learn it from their monitors.
  }
}

std::optional<std::string> Distributed::failure() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->failure;
}

void Distributed::finish() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->monitor.joinable()) impl_->monitor.join();
  try {
    impl_->store->add("finished", 1);
    if (rank() == 0) {
      const auto deadline = Clock::now() + impl_->options.timeout;
      while (impl_->store->add("finished", 0) < world_size() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  } catch (const std::exception& e) {
    engine_log_warn(fmt::format("rank {}: the rendezvous store went away during shutdown: {}", rank(), e.what()));
  }
}

}  // namespace gpipe
