// The naive executor: one thread, one stream per device, blocking. It runs all ranks' actions in
// the validator's dry-run step order; within a step, sends go before receives so that every
// receive finds its tensor already in the mailbox (a receive that does not is a schedule bug).
#include <algorithm>
#include <chrono>
#include <tuple>

#include <fmt/format.h>

#include "action_runner.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/metrics/timeline.h"

namespace gpipe {
namespace {

bool is_receive(ActionType t) { return t == ActionType::kRecvForward || t == ActionType::kRecvBackward; }

class NaiveExecutor final : public Executor {
 public:
  explicit NaiveExecutor(ExecutorOptions options) : options_(std::move(options)) {}
  const char* name() const override { return "naive"; }

  std::vector<std::string> describe_streams(const std::vector<c10::Device>& rank_devices) const override {
    std::vector<std::string> lines;
    for (size_t r = 0; r < rank_devices.size(); ++r) {
      RankStreams streams(rank_devices[r], StreamPolicy::kSingle, options_.priority);
      lines.push_back(fmt::format("rank {}: {}", r, streams.describe()));
    }
    return lines;
  }

  void run_step(const StepContext& ctx) override {
    const Schedule& schedule = *ctx.schedule;
    const ValidationResult validation = validate(schedule);
    if (!validation.ok) {
      std::string why;
      for (const auto& issue : validation.issues) why += fmt::format("\n  rank {} step {}: {}", issue.rank, issue.step, issue.message);
      throw std::runtime_error("the schedule does not validate:" + why);
    }
    struct Item {
      int step, receive, rank, index;
    };
    std::vector<Item> order;
    const std::vector<int> here = ctx.ranks_here();
    for (int r : here) {
      const auto& program = schedule.per_rank[static_cast<size_t>(r)];
      const auto& steps = validation.step_of_action.at(static_cast<size_t>(r));
      // The dry run stamps a communication group with the step it completed; its sends were
      // posted at the step after the action before the group. Sends run at posting time (they
      // are buffered here), receives at completion, so every receive finds its message.
      int posted_at = 0;
      for (size_t i = 0; i < program.size(); ++i) {
        const bool receive = is_receive(program[i].type);
        const bool comm = is_communication(program[i].type);
        if (!comm || i == 0 || !is_communication(program[i - 1].type)) posted_at = i == 0 ? 0 : steps[i - 1] + 1;
        const int step = comm && !receive ? posted_at : steps[i];
        order.push_back({step, receive ? 1 : 0, r, static_cast<int>(i)});
      }
    }
    std::sort(order.begin(), order.end(), [](const Item& a, const Item& b) {
      return std::tie(a.step, a.receive, a.rank, a.index) < std::tie(b.step, b.receive, b.rank, b.index);
    });

    if (ctx.recorder != nullptr) ctx.recorder->begin_step(schedule.num_ranks);
    const auto gpu_marks = record_gpu_step_marks(ctx);
    std::vector<std::unique_ptr<RankStreams>> streams;
    std::vector<std::unique_ptr<ActionRunner>> runners;
    // One thread runs everything, so a receive from a rank of this process must never wait: the
    // mailbox has it or never will. Ranks of other processes run concurrently: their messages
    // get the full receive timeout (the global step order rules out a wait cycle).
    ExecutorOptions no_wait = options_;
    if (static_cast<int>(here.size()) == schedule.num_ranks) no_wait.recv_timeout = std::chrono::milliseconds(0);
    streams.resize(static_cast<size_t>(schedule.num_ranks));
    runners.resize(static_cast<size_t>(schedule.num_ranks));
    for (int r : here) {
      streams[static_cast<size_t>(r)] = std::make_unique<RankStreams>(ctx.rank_devices.at(static_cast<size_t>(r)),
                                                                      StreamPolicy::kSingle, options_.priority);
      runners[static_cast<size_t>(r)] =
          std::make_unique<ActionRunner>(ctx, r, *streams[static_cast<size_t>(r)], no_wait, gpu_marks[static_cast<size_t>(r)]);
    }
    const BackwardOnCallingThread backward_here;
    try {
      for (const Item& item : order) {
        const c10::Device device = ctx.rank_devices.at(static_cast<size_t>(item.rank));
        bind_thread_to_device(device);
        AutocastScope autocast(device, options_.bf16_autocast);
        runners[static_cast<size_t>(item.rank)]->run(
            schedule.per_rank[static_cast<size_t>(item.rank)][static_cast<size_t>(item.index)]);
      }
    } catch (...) {
      // Sends ran ahead of the action that failed: their messages must not reach the next step.
      discard_failed_step(ctx);
      throw;
    }
    synchronize_devices(ctx.rank_devices);
    if (ctx.recorder != nullptr) ctx.recorder->end_step();
    for (const auto& runner : runners) {
      if (runner) runner->check_drained();
    }
    check_transport_drained(ctx);
  }

 private:
  ExecutorOptions options_;
};

}  // namespace

std::unique_ptr<Executor> make_naive_executor(ExecutorOptions options) {
  return std::make_unique<NaiveExecutor>(std::move(options));
}

}  // namespace gpipe
