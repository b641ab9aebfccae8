// The async_threaded executor: one thread per rank runs its own program against the transport.
// The threads (WorkerThread "rank<r>", and "rank<r>-fwd" for overlapped pairs) are made at the
// first step and kept: each step hands every rank its program and waits for all of them.
// On CUDA (parallel.streams=per_microbatch) each micro-batch's forward and backward get streams of
// their own (priority per parallel.priority; autograd still runs backward kernels on the
// forward's stream, see RankStreams), all W's of a rank share one stream, and events order them;
// per_rank puts every action of a rank on one default-priority stream of its own. On CPU there
// are no streams. An overlapped pair (Action::overlaps_next) runs its forward on the rank's
// forward lane and its backward on the rank's thread at the same time (run_overlapped). The
// first failing rank aborts the transport so its peers stop waiting, and its error is the one
// reported.
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "action_runner.h"
#include "forward_lane.h"
#include "worker_thread.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/metrics/timeline.h"

namespace gpipe {
namespace {

class AsyncThreadedExecutor final : public Executor {
 public:
  explicit AsyncThreadedExecutor(ExecutorOptions options) : options_(std::move(options)) {}
  const char* name() const override { return "async_threaded"; }

  std::vector<std::string> describe_streams(const std::vector<c10::Device>& rank_devices) const override {
    std::vector<std::string> lines;
    for (size_t r = 0; r < rank_devices.size(); ++r) {
      RankStreams streams(rank_devices[r], stream_policy(), options_.priority);
      lines.push_back(fmt::format("rank {}: {}", r, streams.describe()));
    }
    return lines;
  }

  void run_step(const StepContext& ctx) override {
    const Schedule& schedule = *ctx.schedule;
    const auto ranks = static_cast<size_t>(schedule.num_ranks);
    // Streams persist across steps (created once per rank, never shared between ranks).
    const std::vector<int> here = ctx.ranks_here();
    if (streams_.size() != ranks) {
      streams_.clear();
      streams_.resize(ranks);
      for (int r : here) {
        streams_[static_cast<size_t>(r)] = std::make_unique<RankStreams>(
            ctx.rank_devices.at(static_cast<size_t>(r)), stream_policy(), options_.priority);
      }
    }
    // GPU clock zero first: every action of the step comes after it on its device.
    const auto gpu_marks = record_gpu_step_marks(ctx);
    // The optimizer step ran on each device's current stream on this thread: the pool streams
    // wait for it before this step's actions use the weights.
    for (auto& s : streams_) {
      if (s) s->begin_step();
    }
    std::vector<std::unique_ptr<ActionRunner>> runners(ranks);
    for (int r : here) {
      runners[static_cast<size_t>(r)] =
          std::make_unique<ActionRunner>(ctx, r, *streams_[static_cast<size_t>(r)], options_, gpu_marks[static_cast<size_t>(r)]);
    }

    std::mutex error_mu;
    std::optional<std::string> first_error;
    auto fail = [&](const std::string& what) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!first_error) {
        first_error = what;
        ctx.transport->abort(what);
      }
    };

    if (ctx.recorder != nullptr) ctx.recorder->begin_step(schedule.num_ranks);
    if (workers_.size() != ranks) {
      workers_.clear();
      workers_.resize(ranks);
    }
    // Every rank's thread exists before any program starts (a thread that cannot be made fails
    // the step here, before a peer could wait for it).
    for (int rank : here) {
      const auto r = static_cast<size_t>(rank);
      const c10::Device device = ctx.rank_devices.at(r);
      if (!workers_[r] || workers_[r]->rank.device() != device) workers_[r] = std::make_unique<RankThreads>(device, rank);
    }
    std::vector<std::future<void>> programs;
    programs.reserve(here.size());
    try {
      for (int rank : here) {
        const auto r = static_cast<size_t>(rank);
        const c10::Device device = ctx.rank_devices.at(r);
        RankThreads* threads = workers_[r].get();
        programs.push_back(threads->rank.run([&, r, device, threads] {
          try {
            const BackwardOnCallingThread backward_here;
            // One AutocastScope per action (as in the naive executor), not per step: autocast's
            // per-thread cache of bf16 weight copies made by F(mb0) on its stream would otherwise
            // be reused by F(mbk) on another stream with no ordering between them. split_linear's
            // weights are cast once per step anyway (ActionRunner's WeightCastCache, ordered).
            run_program(
                schedule.per_rank[r],
                [&](const Action& action) {
                  AutocastScope autocast(device, options_.bf16_autocast);
                  runners[r]->run(action);
                },
                [&](const Action& first, const Action& second) {
                  if (!threads->lane) threads->lane.emplace(device, static_cast<int>(r));
                  run_overlapped(*runners[r], *threads->lane, device, first, second);
                });
            runners[r]->check_drained();
          } catch (const std::exception& e) {
            fail(e.what());
          } catch (...) {
            fail(fmt::format("rank {}: unknown exception", r));
          }
        }));
      }
    } catch (const std::exception& e) {
      // The programs already handed out reference this frame: abort their receives and wait.
      fail(fmt::format("could not hand every rank its program: {}", e.what()));
    }
    // Every program ends before this frame may (they reference it), whatever one of them threw;
    // the tasks catch everything they can (fail() above), so get() only rethrows the impossible.
    for (auto& p : programs) p.wait();
    for (auto& p : programs) p.get();
    if (first_error) {
      // The runners die with this frame and with them the step's bf16 weight copies: the streams
      // that may still read them finish first.
      const size_t dropped = discard_failed_step(ctx);
      throw std::runtime_error(*first_error + (dropped ? fmt::format(" ({} undelivered message(s) dropped)", dropped) : ""));
    }
    synchronize_devices(ctx.rank_devices);
    if (ctx.recorder != nullptr) ctx.recorder->end_step();
    check_transport_drained(ctx);
  }

 private:
  // A run of consecutive communication actions is one group, posted at once (schedule.h). Sends
  // never block here, so running the group's sends before its receives is equivalent to posting
  // it at once, and cannot deadlock against a peer whose group starts with receives.
  template <typename Run, typename RunPair>
  static void run_program(const std::vector<Action>& program, const Run& run, const RunPair& run_pair) {
    size_t i = 0;
    while (i < program.size()) {
      if (!is_communication(program[i].type)) {
        if (program[i].overlaps_next && i + 1 < program.size()) {
          run_pair(program[i], program[i + 1]);
          i += 2;
        } else {
          run(program[i++]);
        }
        continue;
      }
      size_t end = i;
      while (end < program.size() && is_communication(program[end].type)) ++end;
      for (size_t k = i; k < end; ++k) {
        if (!is_receive(program[k].type)) run(program[k]);
      }
      for (size_t k = i; k < end; ++k) {
        if (is_receive(program[k].type)) run(program[k]);
      }
      i = end;
    }
  }
  static bool is_receive(ActionType t) { return t == ActionType::kRecvForward || t == ActionType::kRecvBackward; }

  // An overlapped pair: the forward on the lane (best-effort class under backward_first, see
  // RankStreams::enter), the backward here (high priority), both in flight until both are done.
  // Their receives ran before (those posted are taken first) and their sends run after
  // (with_communication), so neither half touches the transport and neither can wait for the
  // other. If either half fails, the other still finishes before the error leaves (its tensors
  // live in the runner), the backward's error first.
  void run_overlapped(ActionRunner& runner, ForwardLane& lane, c10::Device device, const Action& first,
                      const Action& second) const {
    const bool first_is_forward = first.type == ActionType::kForward;
    const Action& forward = first_is_forward ? first : second;
    const Action& backward = first_is_forward ? second : first;
    if (forward.type != ActionType::kForward ||
        !(backward.type == ActionType::kBackward || backward.type == ActionType::kBackwardInput)) {
      throw std::logic_error(fmt::format("overlapped pair {} is not a forward and a backward (validate() refuses it)",
                                         to_string_pair(first, second)));
    }
    // Their posted receives are taken here, on the rank's thread, before either half starts.
    runner.receive_input(forward);
    runner.receive_input(backward);
    const bool bf16 = options_.bf16_autocast;
    std::future<void> forward_done = lane.run([&runner, &forward, device, bf16] {
      AutocastScope autocast(device, bf16);
      runner.run(forward, ActionLane::kForwardLane);
    });
    std::exception_ptr backward_error;
    try {
      AutocastScope autocast(device, bf16);
      runner.run(backward);
    } catch (...) {
      backward_error = std::current_exception();
    }
    try {
      forward_done.get();
    } catch (...) {
      if (!backward_error) throw;
    }
    if (backward_error) std::rethrow_exception(backward_error);
  }

  // A rank's threads, kept across steps (remade only if the rank moves to another device).
  struct RankThreads {
    RankThreads(c10::Device device, int rank) : rank(device, "rank" + std::to_string(rank)) {}
    WorkerThread rank;
    std::optional<ForwardLane> lane;  // made at the rank's first overlapped pair
  };

  StreamPolicy stream_policy() const {
    return options_.streams == "per_rank" ? StreamPolicy::kPerRank : StreamPolicy::kPerMicrobatch;
  }

  ExecutorOptions options_;
  std::vector<std::unique_ptr<RankStreams>> streams_;
  std::vector<std::unique_ptr<RankThreads>> workers_;  // by rank; null for ranks of other processes
};

}  // namespace

std::unique_ptr<Executor> make_async_threaded_executor(ExecutorOptions options) {
  return std::make_unique<AsyncThreadedExecutor>(std::move(options));
}

}  // namespace gpipe
