// ActionRunner: the per-action methods both executors share, and the executor factory.
#include <fmt/format.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#include "action_runner.h"
#include "trainer/config/config.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/metrics/timeline.h"

namespace gpipe {

std::unique_ptr<Executor> make_executor(const std::string& name, ExecutorOptions options) {
  if (name == "naive") return make_naive_executor(std::move(options));
  if (name == "async_threaded") return make_async_threaded_executor(std::move(options));
  throw ConfigError("parallel.scheduler='" + name + "' is not an executor: use naive or async_threaded");
}

std::vector<int> StepContext::ranks_here() const {
  if (!local_ranks.empty()) return local_ranks;
  std::vector<int> all;
  for (int r = 0; r < schedule->num_ranks; ++r) all.push_back(r);
  return all;
}

namespace {
// An action's GPU span: its two events against the step's mark on the same device.
class EventSpanTimes final : public GpuSpanTimes {
 public:
  EventSpanTimes(std::shared_ptr<const TimingEvent> mark, std::shared_ptr<const TimingEvent> start,
                 std::shared_ptr<const TimingEvent> end)
      : mark_(std::move(mark)), start_(std::move(start)), end_(std::move(end)) {}
  std::pair<double, double> start_end_us() const override {
    return {1e3 * start_->ms_since(*mark_), 1e3 * end_->ms_since(*mark_)};
  }

 private:
  std::shared_ptr<const TimingEvent> mark_, start_, end_;
};
}  // namespace

std::vector<std::shared_ptr<const TimingEvent>> record_gpu_step_marks(const StepContext& ctx) {
  std::vector<std::shared_ptr<const TimingEvent>> marks(ctx.rank_devices.size());
  if (ctx.recorder == nullptr) return marks;
  std::map<c10::DeviceIndex, std::shared_ptr<const TimingEvent>> per_device;
  for (int r : ctx.ranks_here()) {
    const c10::Device device = ctx.rank_devices.at(static_cast<size_t>(r));
    if (!device.is_cuda()) continue;
    auto& mark = per_device[device.index()];
    if (!mark) mark = record_timing_event(device);
    marks[static_cast<size_t>(r)] = mark;
  }
  return marks;
}

ActionRunner::ActionRunner(const StepContext& ctx, int rank, RankStreams& streams, const ExecutorOptions& options,
                           std::shared_ptr<const TimingEvent> gpu_step_mark)
    : ctx_(ctx), rank_(rank), streams_(streams), options_(options), gpu_step_mark_(std::move(gpu_step_mark)) {}

void ActionRunner::gpu_span_begin() {
  if (gpu_step_mark_) gpu_start_ = record_timing_event(ctx_.rank_devices.at(static_cast<size_t>(rank_)));
}

void ActionRunner::gpu_span_end() {
  if (gpu_step_mark_) gpu_end_ = record_timing_event(ctx_.rank_devices.at(static_cast<size_t>(rank_)));
}

StageRuntime& ActionRunner::stage(int s) const {
  if (s < 0 || s >= static_cast<int>(ctx_.stages.size()) || ctx_.stages[static_cast<size_t>(s)] == nullptr) {
    throw std::logic_error(fmt::format("the schedule names stage {} but the pipeline has {} stages", s,
                                       ctx_.stages.size()));
  }
  return *ctx_.stages[static_cast<size_t>(s)];
}

void ActionRunner::run(const Action& action) {
  const auto start = ActionRecorder::Clock::now();
  gpu_start_ = gpu_end_ = nullptr;
  const bool compute = is_compute(action.type);
  if (!compute) gpu_span_begin();
  try {
    dispatch(action);
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("rank {} action {}: {}", rank_, to_string(action), e.what()));
  }
  if (!compute) gpu_span_end();
  if (ctx_.recorder == nullptr) return;
  std::shared_ptr<const GpuSpanTimes> gpu;
  if (gpu_step_mark_) {
    if (!gpu_start_ || !gpu_end_) throw std::logic_error(fmt::format("action {} recorded no GPU span", to_string(action)));
    gpu = std::make_shared<EventSpanTimes>(gpu_step_mark_, gpu_start_, gpu_end_);
  }
  ctx_.recorder->record(rank_, action, start, ActionRecorder::Clock::now(), std::move(gpu));
}

void ActionRunner::dispatch(const Action& a) {
  if (a.microbatch < 0 || a.microbatch >= static_cast<int>(ctx_.microbatches.size())) {
    throw std::logic_error(fmt::format("micro-batch {} out of range (the step has {})", a.microbatch,
                                       ctx_.microbatches.size()));
  }
  switch (a.type) {
    case ActionType::kForward: return forward(a);
    case ActionType::kBackward: return backward(a);
    case ActionType::kBackwardInput: return backward_input(a);
    case ActionType::kBackwardWeight: return backward_weight(a);
    case ActionType::kSendForward: return send_forward(a);
    case ActionType::kRecvForward: return recv_forward(a);
    case ActionType::kSendBackward: return send_backward(a);
    case ActionType::kRecvBackward: return recv_backward(a);
  }
  throw std::logic_error("unknown action type");
}

Message ActionRunner::take_input(std::map<Key, Message>& inbox, std::map<Key, Message>& neighbour_outbox, Key key,
                                 Key neighbour_key, const char* what) {
  if (auto it = inbox.find(key); it != inbox.end()) {
    Message m = std::move(it->second);
    inbox.erase(it);
    return m;
  }
  if (auto it = neighbour_outbox.find(neighbour_key); it != neighbour_outbox.end()) {
    Message m = std::move(it->second);
    neighbour_outbox.erase(it);
    return m;
  }
  throw std::logic_error(fmt::format("no {} for stage {}, micro-batch {} was received before it was needed "
                                     "(the schedule lacks the receive, or orders it after the compute)",
                                     what, key.first, key.second));
}

at::Tensor ActionRunner::ready_tensor(const Message& m) {
  RankStreams::wait(m.ready);
  streams_.record_use(m.tensor);
  return m.tensor;
}

void ActionRunner::forward(const Action& a) {
  auto scope = streams_.enter(a.type, a.microbatch);
  StageRuntime& st = stage(a.stage);
  at::Tensor activation;
  if (!st.spec().is_first()) {
    Message in = take_input(activations_in_, activations_out_, {a.stage, a.microbatch}, {a.stage - 1, a.microbatch},
                            "activation");
    activation = ready_tensor(in);
  }
  const bool cast_once = options_.bf16_autocast;
  auto cast_by = weights_cast_.find(a.stage);
  if (cast_once && cast_by != weights_cast_.end()) RankStreams::wait(cast_by->second);
  gpu_span_begin();
  at::Tensor out;
  {
    std::optional<WeightCastCache::Use> use_casts;
    if (cast_once) use_casts.emplace(weight_casts_);
    out = st.forward(a.microbatch, ctx_.microbatches[static_cast<size_t>(a.microbatch)], activation);
  }
  gpu_span_end();
  auto done = streams_.record_ready();
  if (cast_once && cast_by == weights_cast_.end()) weights_cast_[a.stage] = done;
  forward_done_[{a.stage, a.microbatch}] = done;
  if (!st.spec().is_last()) activations_out_[{a.stage, a.microbatch}] = Message{out, done};
}

void ActionRunner::backward(const Action& a) {
  auto scope = streams_.enter(a.type, a.microbatch);
  StageRuntime& st = stage(a.stage);
  if (auto it = forward_done_.find({a.stage, a.microbatch}); it != forward_done_.end()) {
    RankStreams::wait(it->second);
    forward_done_.erase(it);
  }
  at::Tensor output_grad;
  if (!st.spec().is_last()) {
    Message in = take_input(grads_in_, grads_out_, {a.stage, a.microbatch}, {a.stage + 1, a.microbatch}, "gradient");
    output_grad = ready_tensor(in);
  }
  // B and I accumulate into .grad through AccumulateGrad nodes (I: every parameter but
  // split_linear weights), which autograd runs on the stream the accumulator was created on; if
  // it is recreated between micro-batches (all graphs using it died) two of them would accumulate
  // on different streams with nothing ordering them. Chain every .grad-writing action (B, I, W)
  // with an event; autograd's stream syncs carry the order from this stream to the accumulation
  // streams.
  RankStreams::wait(grads_accumulated_);
  gpu_span_begin();
  at::Tensor input_grad = a.type == ActionType::kBackward ? st.backward(a.microbatch, output_grad)
                                                          : st.backward_input(a.microbatch, output_grad);
  gpu_span_end();  // autograd made this stream wait for the backward kernels it ran on F(mb)'s stream
  grads_accumulated_ = streams_.record_ready();
  if (!st.spec().is_first()) grads_out_[{a.stage, a.microbatch}] = Message{input_grad, streams_.record_ready()};
}

void ActionRunner::backward_input(const Action& a) { backward(a); }

void ActionRunner::backward_weight(const Action& a) {
  // Every W runs on the rank's one W stream (RankStreams::enter), and waits for earlier B's, so
  // the g.add_ into .grad of different micro-batches is ordered.
  auto scope = streams_.enter(a.type, a.microbatch);
  RankStreams::wait(grads_accumulated_);
  gpu_span_begin();
  stage(a.stage).backward_weight(a.microbatch);
  gpu_span_end();
  grads_accumulated_ = streams_.record_ready();
}

void ActionRunner::send_forward(const Action& a) {
  auto it = activations_out_.find({a.stage, a.microbatch});
  if (it == activations_out_.end()) {
    throw std::logic_error(fmt::format("nothing to send: forward of stage {}, micro-batch {} has not run", a.stage,
                                       a.microbatch));
  }
  ctx_.transport->send({TransferKind::kActivation, a.stage + 1, a.microbatch}, std::move(it->second));
  activations_out_.erase(it);
}

void ActionRunner::recv_forward(const Action& a) {
  activations_in_[{a.stage, a.microbatch}] =
      ctx_.transport->recv({TransferKind::kActivation, a.stage, a.microbatch}, options_.recv_timeout);
}

void ActionRunner::send_backward(const Action& a) {
  auto it = grads_out_.find({a.stage, a.microbatch});
  if (it == grads_out_.end()) {
    throw std::logic_error(fmt::format("nothing to send: backward of stage {}, micro-batch {} has not run", a.stage,
                                       a.microbatch));
  }
  ctx_.transport->send({TransferKind::kGradient, a.stage - 1, a.microbatch}, std::move(it->second));
  grads_out_.erase(it);
}

void ActionRunner::recv_backward(const Action& a) {
  grads_in_[{a.stage, a.microbatch}] =
      ctx_.transport->recv({TransferKind::kGradient, a.stage, a.microbatch}, options_.recv_timeout);
}

void ActionRunner::check_drained() const {
  const size_t left = activations_in_.size() + activations_out_.size() + grads_in_.size() + grads_out_.size();
  if (left != 0) {
    throw std::logic_error(fmt::format("rank {}: {} tensor(s) were produced or received but never used "
                                       "(the schedule is missing sends or computes)", rank_, left));
  }
}

}  // namespace gpipe
