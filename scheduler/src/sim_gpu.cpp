// Discrete-event simulated GPU. The model is described in scheduler/sim_gpu.h; this file keeps
// it event-driven: blocks of one kernel dispatched at the same moment form one "group" that
// finishes together, and each running kernel carries a virtual progress clock `v` that advances at
// its current rate (1, or the bandwidth share of memory-bound kernels), so a rate change costs one
// pass over the running kernels instead of one per block.
#include "scheduler/sim_gpu.h"

#include "sim_gpu_state.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

namespace sched {
using namespace sim;

struct SimulatedGpu::Impl {
  SimGpuConfig cfg;
  mutable std::mutex mu;
  CompletionListener* listener = nullptr;
  std::mt19937_64 rng;

  int64_t now = 0;
  bool dispatch_pending = false;
  uint64_t submit_counter = 0;
  std::map<StreamId, StreamState> streams;  // ordered: deterministic iteration
  std::map<EventId, EventState> events;
  std::vector<SmState> sms;
  int busy_sms = 0;
  double busy_sm_ns = 0;
  std::vector<SimOp*> kernels;  // active kernels with blocks waiting or running, activation order
  std::vector<SimOp*> timed;    // active copies / memsets / graph launches
  std::vector<Completion> pending;  // for the listener
  std::vector<Completion> history;

  // Time slicing between contexts (ContextSharing::kTimeSlice).
  static constexpr int kAnyContext = -1, kNoContext = -2;
  int active_ctx = -1;          // the context whose blocks may be resident; -1: none yet
  int64_t contended_since = -1; // since when another context has had blocks waiting
  bool draining = false;        // the active context gets no new blocks (its slice is over)
  int switch_target = -1;
  int64_t switch_until = -1;    // >= 0 while a switch is in progress
  uint64_t switches = 0;

  explicit Impl(SimGpuConfig c) : cfg(c), rng(c.seed), sms(static_cast<size_t>(c.sm_count)) {}

  // Resources one block of `k` holds; false when it can never fit an SM.
  bool block_shape(const KernelInfo& k, uint32_t* threads, uint32_t* smem, uint32_t* per_sm) const {
    if (k.sim_blocks_per_sm > 0) {
      uint32_t bps = std::min(k.sim_blocks_per_sm, cfg.max_blocks_per_sm);
      *threads = cfg.max_threads_per_sm / bps;
      *smem = 0;
      *per_sm = bps;
      return true;
    }
    uint64_t raw_threads = k.block.count();
    if (raw_threads == 0 || raw_threads > cfg.max_threads_per_block ||
        k.shared_mem_bytes > cfg.shared_mem_per_sm) {
      return false;
    }
    *threads = round_up_to_warp(raw_threads);
    *smem = k.shared_mem_bytes;
    uint32_t fit = std::min(cfg.max_blocks_per_sm, cfg.max_threads_per_sm / *threads);
    if (*smem > 0) fit = std::min(fit, cfg.shared_mem_per_sm / *smem);
    *per_sm = fit;
    return fit > 0;
  }

  uint32_t fits_on(const SmState& sm, const SimOp& k) const {
    uint32_t fit = std::min(cfg.max_blocks_per_sm - sm.blocks,
                            (cfg.max_threads_per_sm - sm.threads) / k.block_threads);
    if (k.block_smem > 0) fit = std::min(fit, (cfg.shared_mem_per_sm - sm.smem) / k.block_smem);
    return fit;
  }

  // Moves the clock to `t`, advancing every running kernel's progress and the busy integral.
  void advance_clock(int64_t t) {
    if (t <= now) return;
    double dt = static_cast<double>(t - now);
    for (SimOp* k : kernels) {
      if (k->blocks_running > 0) k->v += k->rate * dt;
    }
    busy_sm_ns += busy_sms * dt;
    now = t;
  }

  void complete(SimOp& op) {
    Completion c;
    c.seq = op.seq;
    c.stream = op.stream;
    c.kind = op.kind;
    c.kernel = op.kernel_id;
    c.start_ns = op.start_ns < 0 ? now : op.start_ns;
    c.end_ns = now;
    pending.push_back(c);
    history.push_back(c);
    if (op.kind == OpKind::kEventRecord) {
      events[op.event].complete(op.event_generation);
    }
    StreamState& s = streams[op.stream];
    s.queue.pop_front();  // `op` is the head of its stream (per-stream FIFO)
  }

  // Starts the head op of `s`; returns true when it completed at once (the next head may start).
  bool activate_head(StreamState& s) {
    SimOp& op = *s.queue.front();
    if (op.active) {
      if (op.kind == OpKind::kStreamWaitEvent && events[op.event].completed(op.event_generation)) {
        complete(op);
        return true;
      }
      return false;
    }
    op.active = true;
    op.start_ns = now;
    switch (op.kind) {
      case OpKind::kKernel:
        if (op.blocks_waiting == 0) break;
        op.high_priority = s.high_priority;
        op.context = s.context;
        op.activation_ns = now;
        op.start_ns = -1;  // set when its first block is dispatched
        kernels.push_back(&op);
        return false;
      case OpKind::kCopy:
      case OpKind::kMemset:
      case OpKind::kGraphLaunch:
        if (op.duration_ns <= 0) break;
        op.end_ns = now + static_cast<int64_t>(std::ceil(op.duration_ns));
        timed.push_back(&op);
        return false;
      case OpKind::kStreamWaitEvent:
        if (!events[op.event].completed(op.event_generation)) return false;
        break;
      case OpKind::kEventRecord:
      case OpKind::kHostFunc:
      case OpKind::kMemPool:
        break;
    }
    complete(op);
    return true;
  }

  void activate_streams() {
    bool changed = true;
    while (changed) {
      changed = false;
      for (auto& [id, s] : streams) {
        while (!s.queue.empty() && activate_head(s)) changed = true;
      }
    }
  }

  void start_switch(int target) {
    switch_target = target;
    switch_until = now + cfg.context_switch_ns;
    draining = false;
    contended_since = -1;
    ++switches;
  }

  // The context whose blocks may be dispatched now (kAnyContext: all; kNoContext: none), and the
  // time-slice state machine described in sim_gpu.h.
  int allowed_context() {
    if (cfg.context_sharing == ContextSharing::kMps) return kAnyContext;
    if (switch_until >= 0) {
      if (now < switch_until) return kNoContext;
      active_ctx = switch_target;
      switch_until = -1;
    }
    std::set<int> waiting, running;
    for (const SimOp* k : kernels) {
      if (k->blocks_waiting > 0) waiting.insert(k->context);
      if (k->blocks_running > 0) running.insert(k->context);
    }
    if (active_ctx < 0) {
      if (waiting.empty()) return kNoContext;
      active_ctx = *waiting.begin();  // an idle GPU: no context to switch out
    }
    std::set<int> others = waiting;
    others.erase(active_ctx);
    if (others.empty()) {
      contended_since = -1;
      draining = false;
      return active_ctx;
    }
    if (contended_since < 0) contended_since = now;
    const bool active_busy = waiting.count(active_ctx) > 0 || running.count(active_ctx) > 0;
    if (active_busy && !draining && now < contended_since + cfg.time_slice_ns) return active_ctx;
    draining = true;
    if (running.count(active_ctx) > 0) return kNoContext;  // its running blocks finish first
    auto next = others.upper_bound(active_ctx);            // round robin
    start_switch(next == others.end() ? *others.begin() : *next);
    if (switch_until > now) return kNoContext;
    active_ctx = switch_target;
    switch_until = -1;
    return active_ctx;
  }

  // When the time-slice state machine next needs the clock to stop (-1: no such time).
  int64_t next_context_event() const {
    if (cfg.context_sharing == ContextSharing::kMps) return -1;
    if (switch_until >= 0) return switch_until;
    if (contended_since >= 0 && !draining) return std::max(now, contended_since + cfg.time_slice_ns);
    return -1;
  }

  void dispatch_blocks() {
    const int allowed = allowed_context();
    if (allowed == kNoContext) return;
    std::vector<SimOp*> waiting;
    for (SimOp* k : kernels) {
      if (k->blocks_waiting > 0 && (allowed == kAnyContext || k->context == allowed)) waiting.push_back(k);
    }
    std::stable_sort(waiting.begin(), waiting.end(), [](const SimOp* a, const SimOp* b) {
      if (a->high_priority != b->high_priority) return a->high_priority;
      if (a->activation_ns != b->activation_ns) return a->activation_ns < b->activation_ns;
      return a->submit_order < b->submit_order;
    });
    std::vector<uint32_t> fit(sms.size());
    for (SimOp* k : waiting) {
      uint32_t max_fit = 0;
      const StreamState& st = streams[k->stream];
      const size_t lo = st.sm_count > 0 ? static_cast<size_t>(st.first_sm) : 0;
      const size_t hi = st.sm_count > 0 ? lo + static_cast<size_t>(st.sm_count) : sms.size();
      for (size_t i = 0; i < sms.size(); ++i) {
        fit[i] = i >= lo && i < hi ? fits_on(sms[i], *k) : 0;  // outside its partition: no room
        max_fit = std::max(max_fit, fit[i]);
      }
      // Breadth-first: one block per SM per round, like the hardware block scheduler spreads.
      // Computed as a fill level: every SM gets min(fit, level) blocks, and the first SMs that
      // still have room one more, until the blocks run out.
      if (max_fit == 0) continue;
      // above[l]: SMs with room for more than l blocks (the blocks round l + 1 places).
      std::vector<uint64_t> above(max_fit + 1, 0);
      for (uint32_t f : fit) {
        if (f > 0) ++above[f - 1];
      }
      for (uint32_t l = max_fit; l-- > 0;) above[l] += above[l + 1];
      std::vector<uint32_t> placed(sms.size(), 0);
      uint64_t left = k->blocks_waiting;
      uint32_t level = 0;
      for (; level < max_fit && above[level] <= left; ++level) left -= above[level];
      for (size_t i = 0; i < sms.size(); ++i) {
        placed[i] = std::min(fit[i], level);
        if (left > 0 && level < max_fit && fit[i] > level) {
          ++placed[i];
          --left;
        }
      }
      uint64_t started = k->blocks_waiting - left;
      if (started == 0) continue;
      // Block-time spread: the blocks started now form up to kSpreadGroups groups (dealt out
      // round-robin), each with its own time factor, so waves do not stay in lock-step.
      // Groups of at least kMinGroupBlocks, so refills of a few slots do not fragment further.
      size_t n_groups = cfg.block_spread > 0
                            ? static_cast<size_t>(std::clamp<uint64_t>(started / kMinGroupBlocks, 1, kSpreadGroups))
                            : 1;
      std::vector<BlockGroup> groups(n_groups);
      for (BlockGroup& g : groups) {
        double factor = 1.0;
        if (cfg.block_spread > 0) {
          std::uniform_real_distribution<double> spread(1.0 - cfg.block_spread, 1.0 + cfg.block_spread);
          factor = spread(rng);
        }
        g.v_finish = k->v + k->block_ns * factor;
      }
      size_t next_group = 0;
      for (size_t i = 0; i < sms.size(); ++i) {
        if (placed[i] == 0) continue;
        SmState& sm = sms[i];
        if (sm.blocks == 0) ++busy_sms;
        sm.blocks += placed[i];
        sm.threads += placed[i] * k->block_threads;
        sm.smem += placed[i] * k->block_smem;
        for (uint32_t b = 0; b < placed[i]; ++b) {
          BlockGroup& g = groups[next_group];
          next_group = (next_group + 1) % n_groups;
          if (g.per_sm.empty() || g.per_sm.back().first != static_cast<int>(i)) g.per_sm.emplace_back(static_cast<int>(i), 0);
          ++g.per_sm.back().second;
          ++g.blocks;
        }
      }
      for (BlockGroup& g : groups) {
        // Keep the kernel's groups ordered by finish progress (front finishes first).
        auto pos = std::upper_bound(k->groups.begin(), k->groups.end(), g.v_finish,
                                    [](double v, const BlockGroup& other) { return v < other.v_finish; });
        k->groups.insert(pos, std::move(g));
      }
      if (k->start_ns < 0) k->start_ns = now;
      k->blocks_waiting -= started;
      k->blocks_running += started;
    }
  }

  // Bandwidth share of memory-bound kernels and issue share of compute-bound ones (see the header).
  void update_rates() {
    double memory_demand = 0, compute_demand = 0;
    for (const SimOp* k : kernels) {
      if (k->blocks_running == 0) continue;
      double full_gpu = static_cast<double>(cfg.sm_count) * k->blocks_per_sm;
      double blocks = static_cast<double>(k->blocks_running);
      if (k->memory_bound) {
        memory_demand += std::min(1.0, blocks / std::max(1.0, cfg.memory_saturation_fraction * full_gpu));
      } else {
        compute_demand += blocks / full_gpu;
      }
    }
    double memory_rate = memory_demand > 1.0 ? 1.0 / memory_demand : 1.0;
    double compute_rate = compute_demand > 1.0 ? 1.0 / compute_demand : 1.0;
    for (SimOp* k : kernels) k->rate = k->memory_bound ? memory_rate : compute_rate;
  }

  // Activates stream heads and dispatches blocks at the current time.
  void settle() {
    activate_streams();
    dispatch_blocks();
    update_rates();
    dispatch_pending = false;
  }

  static bool group_done(const SimOp& k, const BlockGroup& g) {
    return k.v >= g.v_finish - (1e-9 * g.v_finish + 1e-6);
  }

  int64_t group_end_time(const SimOp& k, const BlockGroup& g) const {
    double remaining = std::max(0.0, g.v_finish - k.v);
    return now + static_cast<int64_t>(std::ceil(remaining / k.rate - 1e-9));
  }

  // Earliest completion of a running block group or timed op; -1 when none.
  int64_t next_completion() const {
    int64_t best = -1;
    for (const SimOp* k : kernels) {
      if (k->groups.empty()) continue;
      int64_t t = group_end_time(*k, k->groups.front());
      if (best < 0 || t < best) best = t;
    }
    for (const SimOp* op : timed) {
      if (best < 0 || op->end_ns < best) best = op->end_ns;
    }
    const int64_t tc = next_context_event();
    if (tc >= 0 && (best < 0 || tc < best)) best = tc;
    return best;
  }

  // Retires every block group and timed op finished at the current time.
  void retire_finished() {
    std::vector<SimOp*> finished;
    for (SimOp* k : kernels) {
      while (!k->groups.empty() && group_done(*k, k->groups.front())) {
        const BlockGroup& g = k->groups.front();
        for (auto [i, n] : g.per_sm) {
          SmState& sm = sms[static_cast<size_t>(i)];
          sm.blocks -= n;
          sm.threads -= n * k->block_threads;
          sm.smem -= n * k->block_smem;
          if (sm.blocks == 0) --busy_sms;
        }
        k->blocks_running -= g.blocks;
        k->groups.pop_front();
      }
      if (k->blocks_running == 0 && k->blocks_waiting == 0) finished.push_back(k);
    }
    // Complete in the order of `kernels` (deterministic); erase before complete() frees the op.
    for (SimOp* k : finished) {
      kernels.erase(std::find(kernels.begin(), kernels.end(), k));
      complete(*k);
    }
    std::vector<SimOp*> done_timed;
    for (SimOp* op : timed) {
      if (op->end_ns <= now) done_timed.push_back(op);
    }
    std::stable_sort(done_timed.begin(), done_timed.end(),
                     [](const SimOp* a, const SimOp* b) { return a->seq < b->seq; });
    for (SimOp* op : done_timed) {
      timed.erase(std::find(timed.begin(), timed.end(), op));
      complete(*op);
    }
  }

  void advance_to(int64_t t) {
    if (t < now) {
      throw std::invalid_argument("SimulatedGpu::advance_to(" + std::to_string(t) +
                                  "): the clock is already at " + std::to_string(now) +
                                  " ns; virtual time cannot go back");
    }
    if (dispatch_pending) settle();
    for (;;) {
      int64_t te = next_completion();
      if (te < 0 || te > t) break;
      advance_clock(te);
      retire_finished();
      settle();
    }
    advance_clock(t);
  }

  bool idle() const {
    for (const auto& [id, s] : streams) {
      if (!s.queue.empty()) return false;
    }
    return true;
  }
};

SimulatedGpu::SimulatedGpu(SimGpuConfig config) {
  if (config.sm_count <= 0) {
    throw std::invalid_argument("SimGpuConfig.sm_count=" + std::to_string(config.sm_count) +
                                ": the simulated GPU needs at least one SM");
  }
  if (config.max_threads_per_sm == 0 || config.max_blocks_per_sm == 0 ||
      config.copy_bytes_per_ns <= 0 || config.memset_bytes_per_ns <= 0 ||
      config.memory_saturation_fraction <= 0 || config.jitter < 0 || config.block_spread < 0 ||
      config.block_spread >= 1) {
    throw std::invalid_argument(
        "SimGpuConfig: per-SM limits, bandwidths and memory_saturation_fraction must be positive "
        "and jitter non-negative; block_spread must be in [0, 1)");
  }
  if (config.time_slice_ns <= 0 || config.context_switch_ns < 0) {
    throw std::invalid_argument("SimGpuConfig: time_slice_ns must be positive and context_switch_ns non-negative");
  }
  impl_ = std::make_unique<Impl>(config);
}

SimulatedGpu::~SimulatedGpu() = default;

int SimulatedGpu::submit(const Op& op) {
  auto sim = std::make_unique<SimOp>();
  sim->seq = op.seq;
  sim->stream = op.stream;
  sim->kind = op.kind;
  sim->kernel_id = op.kernel.id;
  sim->event = op.event;
  sim->bytes = op.bytes;
  std::lock_guard<std::mutex> lock(impl_->mu);
  const SimGpuConfig& cfg = impl_->cfg;
  switch (op.kind) {
    case OpKind::kKernel: {
      if (!impl_->block_shape(op.kernel, &sim->block_threads, &sim->block_smem, &sim->blocks_per_sm)) {
        return kSimErrorInvalidValue;
      }
      sim->blocks_waiting = op.kernel.grid.count();
      sim->block_ns = op.kernel.sim_block_ns > 0 ? op.kernel.sim_block_ns : cfg.default_block_ns;
      if (cfg.jitter > 0) {
        std::normal_distribution<double> noise(1.0, cfg.jitter);
        sim->block_ns *= std::clamp(noise(impl_->rng), 0.5, 1.5);
      }
      sim->memory_bound = op.kernel.profile_hint == KernelProfile::kMemoryBound;
      break;
    }
    case OpKind::kCopy:
      sim->duration_ns = static_cast<double>(op.bytes) / cfg.copy_bytes_per_ns;
      break;
    case OpKind::kMemset:
      sim->duration_ns = static_cast<double>(op.bytes) / cfg.memset_bytes_per_ns;
      break;
    case OpKind::kGraphLaunch:
      sim->duration_ns = op.kernel.sim_block_ns;
      break;
    case OpKind::kEventRecord:
      sim->event_generation = ++impl_->events[op.event].submitted;
      break;
    case OpKind::kStreamWaitEvent:
      // Waits for the latest record submitted before it (0: none, nothing to wait for).
      sim->event_generation = impl_->events[op.event].submitted;
      break;
    case OpKind::kHostFunc:
    case OpKind::kMemPool:
      break;
  }
  sim->submit_order = impl_->submit_counter++;
  impl_->streams[op.stream].queue.push_back(std::move(sim));
  impl_->dispatch_pending = true;
  return 0;
}

void SimulatedGpu::poll() {
  std::vector<Completion> done;
  CompletionListener* listener = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->listener == nullptr) return;  // keep them until someone listens
    done.swap(impl_->pending);
    listener = impl_->listener;
  }
  for (const Completion& c : done) listener->on_complete(c);
}

void SimulatedGpu::set_listener(CompletionListener* listener) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->listener = listener;
}

int SimulatedGpu::sm_count() const { return impl_->cfg.sm_count; }

int SimulatedGpu::max_active_blocks_per_sm(const KernelInfo& kernel) {
  uint32_t threads = 0, smem = 0, per_sm = 0;
  if (!impl_->block_shape(kernel, &threads, &smem, &per_sm)) return 0;
  return static_cast<int>(per_sm);
}

int64_t SimulatedGpu::now_ns() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->now;
}

void SimulatedGpu::set_stream_priority(StreamId stream, bool high_priority) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->streams[stream].high_priority = high_priority;
}

void SimulatedGpu::set_stream_sms(StreamId stream, int first_sm, int sm_count) {
  if (sm_count < 0 || first_sm < 0 || (sm_count > 0 && first_sm + sm_count > impl_->cfg.sm_count)) {
    throw std::invalid_argument("set_stream_sms: SMs [" + std::to_string(first_sm) + ", " +
                                std::to_string(first_sm + sm_count) + ") are not within the GPU's " +
                                std::to_string(impl_->cfg.sm_count) + " SMs");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  StreamState& st = impl_->streams[stream];
  st.first_sm = first_sm;
  st.sm_count = sm_count;
  // Blocks still waiting may now fit (a grown partition): dispatch at the next clock drive.
  impl_->dispatch_pending = true;
}

void SimulatedGpu::set_stream_context(StreamId stream, int context) {
  if (context < 0) throw std::invalid_argument("set_stream_context: context " + std::to_string(context) + " is negative");
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->streams[stream].context = context;
}

uint64_t SimulatedGpu::context_switches() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->switches;
}

int64_t SimulatedGpu::next_event_ns() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->dispatch_pending) return impl_->now;
  return impl_->next_completion();
}

void SimulatedGpu::advance_to(int64_t t_ns) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->advance_to(t_ns);
}

int64_t SimulatedGpu::run_until_idle() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->dispatch_pending) impl_->settle();
  for (;;) {
    int64_t te = impl_->next_completion();
    if (te < 0) break;
    impl_->advance_to(te);
  }
  if (!impl_->idle()) {
    // Only a stream-wait-event on a record that sits behind it can be left: a program deadlock.
    throw std::logic_error("SimulatedGpu::run_until_idle: streams are blocked on events that can "
                           "never complete (a wait-event depends on work queued behind it)");
  }
  return impl_->now;
}

bool SimulatedGpu::idle() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->idle();
}

double SimulatedGpu::busy_sm_ns() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->busy_sm_ns;
}

size_t SimulatedGpu::completed_count() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->history.size();
}

std::vector<Completion> SimulatedGpu::completions(size_t from) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (from >= impl_->history.size()) return {};
  return {impl_->history.begin() + static_cast<std::ptrdiff_t>(from), impl_->history.end()};
}

const SimGpuConfig& SimulatedGpu::config() const { return impl_->cfg; }

}  // namespace sched
