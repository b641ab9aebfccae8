// ORION_POLICY=gpud: this process is a best-effort client of the GPU's orion-gpud (issue 25). A
// best-effort op goes only when gpud::admit says it fits the pipeline's published idle window
// (or the pipeline is gone, or the daemon is gone and the fallback is pass); the decision reads
// two shared pages in the calling thread (or the pump's), no round trip to the daemon.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpud/gpud.h"
#include "policy_params.h"
#include "scheduler/gpud_policy.h"
#include "scheduler/policy.h"

namespace sched {
namespace {

// Source: now(), window(now), grant(now). A template, so the shim's reads inline (no indirect
// call on the launch path).
template <class Source>
class GpudPolicy final : public Policy {
 public:
  GpudPolicy(Source source, gpud::AdmissionConfig config) : source_(std::move(source)), config_(config) {}
  const char* name() const override { return "gpud"; }
  bool admit(const Op& op, const OpEstimate& est, const DeviceState& state) const override {
    const int64_t kernel_ns = length_ns(op, est);
    const int64_t now = source_.now();
    gpud::GrantView grant = source_.grant(now);
    // Past the lease the daemon is stuck or gone; a restarted one hands out a new grant.
    if (grant.lease_expiry_ns <= now && source_.lease_expired(now)) grant = source_.grant(now);
    // A restarted daemon has no pipeline until the pipeline's publisher reconnects too: "free"
    // then may only mean "not back yet".
    if (grant.mode == gpud::GrantMode::kFree && source_.waiting_for_pipeline(now)) return false;
    const gpud::Decision d = gpud::admit(source_.window(now), grant, now, kernel_ns,
                                         static_cast<int64_t>(state.be_outstanding_ns), config_);
    if (d.verdict != gpud::Verdict::kRun) return false;
    if (d.in_window && op.kind == OpKind::kKernel) source_.admitted(kernel_ns);
    return true;
  }
  // How long `op` occupies the GPU, as admission needs it (-1: unknown, only into long windows).
  // A whole best-effort process's legacy stream also carries copies, memsets and event records
  // (PyTorch's): copies and memsets from their size (non_kernel_duration_ns, which the in-flight
  // total counts too), bookkeeping ops take no time.
  static int64_t length_ns(const Op& op, const OpEstimate& est) {
    // A profile may say anything (an Orion CSV's "inf", 1e300): at most 1000 s, which fits no
    // window, and never a conversion of a double int64 cannot hold (undefined behaviour).
    constexpr double kLongest = 1e12;
    const double ns = std::min(est.duration_ns, kLongest);
    switch (op.kind) {
      case OpKind::kKernel:
      case OpKind::kGraphLaunch:
        return ns > 0 ? static_cast<int64_t>(ns) : -1;
      case OpKind::kCopy:
      case OpKind::kMemset:
        return ns > 0 ? static_cast<int64_t>(ns) : 0;
      case OpKind::kEventRecord:
      case OpKind::kStreamWaitEvent:
      case OpKind::kHostFunc:
      case OpKind::kMemPool:
        return 0;
    }
    return -1;
  }
  double non_kernel_duration_ns(const Op& op) const override {
    if (op.kind == OpKind::kCopy) return static_cast<double>(op.bytes) / kCopyBytesPerNs;
    if (op.kind == OpKind::kMemset) return static_cast<double>(op.bytes) / kMemsetBytesPerNs;
    return 0;
  }
  static constexpr double kCopyBytesPerNs = 20.0;       // a PCIe 4-5 host copy, the slow case
  static constexpr double kMemsetBytesPerNs = 1'000.0;  // HBM

  // The pipeline's windows, not a timer, say when best-effort work may go: the dispatcher's
  // starvation bound must not push it into the pipeline's busy time.
  bool bounds_best_effort_wait() const override { return false; }
  // Another process owns the GPU's busy time: every stream of this one waits for its windows.
  bool gates_whole_process() const override { return true; }

 private:
  Source source_;
  gpud::AdmissionConfig config_;
};

// The shared pages orion-gpud handed this process, replaced by a restarted daemon's. A daemon
// that stopped or died leaves the lease to run out, and without a new connection this process
// would hold (or, with fallback=pass, run unprotected) its best-effort work until it exits, while
// the pipeline reconnects to the next daemon on its own. So once the lease has run out, at most
// once per kRetryNs and in whichever launching thread gets there first, it looks whether the
// daemon hung up and, if so, connects again (bounded by kConnectBoundNs; a socket nobody serves
// refuses at once; the dispatcher's admission waits meanwhile). A daemon that is stuck but
// connected is left to the lease and the fallback.
// A replaced connection's pages stay mapped until the policy goes: other launching threads may be
// reading them (one set per daemon restart).
class ClientPages {
 public:
  static constexpr int64_t kRetryNs = 250'000'000;
  static constexpr int64_t kConnectBoundNs = 100'000'000;
  // After connecting again, a grant that says "free" (no pipeline) is held this long unless a
  // pipeline attaches: the pipeline's publisher retries at most every 2 s with a 500 ms bound
  // (trainer/colocation/bubble_publisher.cpp), and best-effort work must not run free beside a
  // pipeline that simply has not reconnected yet.
  static constexpr int64_t kPipelineGraceNs = 3'000'000'000;

  ClientPages(std::filesystem::path dir, std::string gpu)
      : state_(std::make_unique<State>(std::move(dir), std::move(gpu))) {}
  int64_t now() const { return gpud::monotonic_ns(); }
  gpud::WindowView window(int64_t /*now*/) const { return gpud::read_window(current().pipeline()); }
  // A torn read (the daemon mid-write) holds, but only while the last good grant's lease runs: a
  // daemon killed mid-write leaves the page torn for good, and then the lease runs out into the
  // user's fallback as for any daemon gone.
  gpud::GrantView grant(int64_t now) const {
    return gpud::read_grant_keeping_lease(current().grant(), now, state_->last_good_lease_ns);
  }
  // Its usage page is this process's own account (atomics).
  void admitted(int64_t kernel_ns) const { gpud::record_admitted(current().usage(), kernel_ns); }
  // True when a restarted daemon's pages replaced the old ones (read the grant again).
  bool lease_expired(int64_t now) const {
    State& s = *state_;
    int64_t next = s.next_try_ns.load(std::memory_order_relaxed);
    if (now < next || !s.next_try_ns.compare_exchange_strong(next, now + kRetryNs)) return false;
    std::lock_guard<std::mutex> lock(s.mu);
    if (current().daemon_alive()) return false;
    try {
      s.clients.push_back(std::make_unique<gpud::Client>(
          gpud::Client::connect(s.dir, s.gpu, gpud::Role::kBestEffort, kClientName, kConnectBoundNs)));
    } catch (const gpud::ProtocolError&) {
      return false;  // not back yet: the next try is kRetryNs away
    }
    s.reconnected_ns.store(now, std::memory_order_relaxed);
    s.current.store(s.clients.back().get(), std::memory_order_release);
    // The old connection's socket goes (its pages stay: other threads may be reading them), so a
    // daemon restarted again and again does not pile up descriptors here.
    s.clients[s.clients.size() - 2]->close_connection();
    return true;
  }
  // Within kPipelineGraceNs of connecting again.
  bool waiting_for_pipeline(int64_t now) const {
    const int64_t since = state_->reconnected_ns.load(std::memory_order_relaxed);
    return since != 0 && now - since < kPipelineGraceNs;
  }
  static constexpr const char* kClientName = "libgpu_scheduler";

 private:
  struct State {
    State(std::filesystem::path d, std::string g) : dir(std::move(d)), gpu(std::move(g)) {
      clients.push_back(std::make_unique<gpud::Client>(gpud::Client::connect(dir, gpu, gpud::Role::kBestEffort, kClientName)));
      current.store(clients.back().get());
    }
    const std::filesystem::path dir;
    const std::string gpu;
    std::mutex mu;  // connecting again
    std::vector<std::unique_ptr<gpud::Client>> clients;  // every connection made, the newest last
    std::atomic<gpud::Client*> current{nullptr};
    std::atomic<int64_t> next_try_ns{0};
    std::atomic<int64_t> reconnected_ns{0};  // 0: never reconnected
    std::atomic<int64_t> last_good_lease_ns{0};  // of the last untorn grant read
  };
  gpud::Client& current() const { return *state_->current.load(std::memory_order_acquire); }
  std::unique_ptr<State> state_;
};

struct FunctionPages {
  GpudSource source;
  int64_t now() const { return source.now_ns(); }
  gpud::WindowView window(int64_t now) const { return source.window(now); }
  gpud::GrantView grant(int64_t now) const { return source.grant(now); }
  void admitted(int64_t /*kernel_ns*/) const {}
  bool lease_expired(int64_t /*now*/) const { return false; }
  bool waiting_for_pipeline(int64_t /*now*/) const { return false; }
};

}  // namespace

std::unique_ptr<Policy> make_gpud_policy(GpudSource source, const gpud::AdmissionConfig& config) {
  if (!source.now_ns || !source.window || !source.grant) {
    throw std::invalid_argument("make_gpud_policy: the source needs a clock, a window and a grant");
  }
  return std::make_unique<GpudPolicy<FunctionPages>>(FunctionPages{std::move(source)}, config);
}

namespace detail {

std::unique_ptr<Policy> make_gpud_policy(const PolicyParams& params) {
  ParamReader r("gpud", params, {"gpu", "dir", "fallback", "guard_us", "unknown_min_window_us", "stale_ms", "max_alone_us"});
  auto it = params.find("gpu");
  if (it == params.end() || it->second.empty()) {
    throw std::invalid_argument("policy 'gpud': parameter 'gpu' (the GPU's UUID orion-gpud serves) is required");
  }
  gpud::AdmissionConfig config;
  config.guard_ns = static_cast<int64_t>(r.number("guard_us", 50.0, 0.0, 1e6) * 1e3);
  config.unknown_kernel_min_window_ns = static_cast<int64_t>(r.number("unknown_min_window_us", 5000.0, 0.0, 1e9) * 1e3);
  config.stale_after_ns = static_cast<int64_t>(r.number("stale_ms", 200.0, 1.0, 1e6) * 1e6);
  config.max_alone_ns = static_cast<int64_t>(r.number("max_alone_us", 0.0, 0.0, 1e9) * 1e3);
  const std::string fallback = params.count("fallback") ? params.at("fallback") : "hold";
  if (fallback != "hold" && fallback != "pass") {
    throw std::invalid_argument("policy 'gpud': parameter 'fallback'='" + fallback + "': hold or pass");
  }
  config.fallback = fallback == "pass" ? gpud::Fallback::kPassThrough : gpud::Fallback::kHold;
  const std::filesystem::path dir = params.count("dir") ? std::filesystem::path(params.at("dir")) : gpud::default_runtime_dir();
  try {
    return std::make_unique<GpudPolicy<ClientPages>>(
        ClientPages(dir, it->second), config);
  } catch (const gpud::ProtocolError& e) {
    throw std::invalid_argument(std::string("policy 'gpud': ") + e.what());
  }
}

std::string gpud_param_docs() {
  return "gpud: this process is a best-effort client of orion-gpud; best-effort ops go only inside the pipeline's\n"
         "  published idle windows (no starvation bound)\n"
         "  gpu=<uuid>        required: the GPU orion-gpud serves (nvidia-smi -L)\n"
         "  dir=<folder>      orion-gpud's runtime folder (default $ORION_GPUD_DIR, $XDG_RUNTIME_DIR/orion-gpud, ...)\n"
         "  fallback=hold     when the daemon is gone (lease expired): hold, or pass (run, unprotected), until\n"
         "                    a restarted orion-gpud answers (tried every 250 ms once the lease ran out)\n"
         "  guard_us=50       kept free before a window closes\n"
         "  unknown_min_window_us=5000  a kernel of unknown duration needs this much window left\n"
         "  stale_ms=200      a pipeline heartbeat older than this is no live pipeline: held until the daemon frees the grant\n"
         "  max_alone_us=0    a kernel over the in-flight budget goes alone only up to this (0: if it fits the window)\n";
}

}  // namespace detail
}  // namespace sched
