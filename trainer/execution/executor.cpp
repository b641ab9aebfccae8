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

size_t discard_failed_step(const StepContext& ctx) {
  try {
    synchronize_devices(ctx.rank_devices);
  } catch (const std::exception&) {
  }
  return ctx.transport->reset();
}

void check_transport_drained(const StepContext& ctx) {
  if (const std::string reason = ctx.transport->aborted_reason(); !reason.empty()) {
    ctx.transport->reset();
    throw TransportError("the step's transfers were aborted: " + reason);
  }
  if (const size_t left = ctx.transport->pending(); left != 0) {
    ctx.transport->reset();
    throw std::runtime_error(fmt::format("{} message(s) were sent but never received: the schedule's sends and "
                                         "receives do not match (check --print-schedule)", left));
  }
}

ActionRunner::ActionRunner(const StepContext& ctx, int rank, RankStreams& streams, const ExecutorOptions& options,
                           std::shared_ptr<const TimingEvent> gpu_step_mark)
    : ctx_(ctx), rank_(rank), streams_(streams), options_(options), gpu_step_mark_(std::move(gpu_step_mark)) {
  if (ctx_.before_last_gradient || ctx_.after_last_gradient) {
    for (const Action& a : ctx_.schedule->per_rank.at(static_cast<size_t>(rank_))) {
      if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput ||
          a.type == ActionType::kBackwardWeight) {
        last_gradient_action_.insert_or_assign(a.stage, a);
      }
    }
  }
}

void ActionRunner::gpu_span_begin(GpuSpan& span) {
  if (gpu_step_mark_) span.start = record_timing_event(ctx_.rank_devices.at(static_cast<size_t>(rank_)));
}

void ActionRunner::gpu_span_end(GpuSpan& span) {
  if (gpu_step_mark_) span.end = record_timing_event(ctx_.rank_devices.at(static_cast<size_t>(rank_)));
}

StageRuntime& ActionRunner::stage(int s) const {
  if (s < 0 || s >= static_cast<int>(ctx_.stages.size()) || ctx_.stages[static_cast<size_t>(s)] == nullptr) {
    throw std::logic_error(fmt::format("the schedule names stage {} but the pipeline has {} stages", s,
                                       ctx_.stages.size()));
  }
  return *ctx_.stages[static_cast<size_t>(s)];
}

void ActionRunner::run(const Action& action, ActionLane lane) {
  const bool compute = is_compute(action.type);
  // A compute's posted input is waited for before its span starts: the wait is idle time, as a
  // receive's was when it held the rank (the bubble and the colocation windows count it so).
  if (compute) receive_input(action);
  const auto start = ActionRecorder::Clock::now();
  GpuSpan span;
  // compute_starting / compute_done pair up however dispatch() leaves (the bubble publisher keeps
  // windows closed in between).
  // On a GPU the action's work is only issued when dispatch() returns: compute_done carries
  // whether the device has run it (its finished event), not waiting for it.
  struct ComputeScope {
    const ActionRecorder* recorder;
    int rank;
    const GpuSpan& span;
    ~ComputeScope() {
      if (recorder == nullptr) return;
      ActionRecorder::ComputeFinished finished;
      if (span.finished) finished = [event = span.finished] { return event->reached(); };
      recorder->compute_done(rank, std::move(finished));
    }
  };
  if (compute && ctx_.recorder != nullptr) ctx_.recorder->compute_starting(rank_);
  {
    const ComputeScope scope{compute ? ctx_.recorder : nullptr, rank_, span};
    if (!compute) gpu_span_begin(span);
    try {
      dispatch(action, span);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("rank {} action {}: {}", rank_, to_string(action), e.what()));
    }
  }
  if (!compute) gpu_span_end(span);
  if (ctx_.recorder == nullptr) return;
  std::shared_ptr<const GpuSpanTimes> gpu;
  if (gpu_step_mark_) {
    if (!span.start || !span.end) throw std::logic_error(fmt::format("action {} recorded no GPU span", to_string(action)));
    gpu = std::make_shared<EventSpanTimes>(gpu_step_mark_, span.start, span.end);
  }
  ctx_.recorder->record(rank_, action, start, ActionRecorder::Clock::now(), std::move(gpu), lane);
}

void ActionRunner::dispatch(const Action& a, GpuSpan& span) {
  if (a.microbatch < 0 || a.microbatch >= static_cast<int>(ctx_.microbatches.size())) {
    throw std::logic_error(fmt::format("micro-batch {} out of range (the step has {})", a.microbatch,
                                       ctx_.microbatches.size()));
  }
  switch (a.type) {
    case ActionType::kForward: return forward(a, span);
    case ActionType::kBackward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
      if (ctx_.before_last_gradient && is_last_gradient(a)) ctx_.before_last_gradient(a.stage);
      return a.type == ActionType::kBackwardWeight ? backward_weight(a, span) : backward(a, span);
    case ActionType::kSendForward: return send_forward(a);
    case ActionType::kRecvForward: return recv_forward(a);
    case ActionType::kSendBackward: return send_backward(a);
    case ActionType::kRecvBackward: return recv_backward(a);
  }
  throw std::logic_error("unknown action type");
}

Message ActionRunner::take_input(std::map<Key, Message>& inbox, std::map<Key, Message>& neighbour_outbox, Key key,
                                 Key neighbour_key, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
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

void ActionRunner::forward(const Action& a, GpuSpan& span) {
  auto scope = streams_.enter(a.type, stream_microbatch(a));
  StageRuntime& st = stage(a.stage);
  at::Tensor activation;
  if (!st.spec().is_first()) {
    Message in = take_input(activations_in_, activations_out_, {a.stage, a.microbatch}, {a.stage - 1, a.microbatch},
                            "activation");
    activation = ready_tensor(in);
  }
  const bool cast_once = options_.bf16_autocast && !asynchronous();
  if (asynchronous()) RankStreams::wait(last_write(a.stage));
  std::shared_ptr<const ReadyEvent> cast_by;  // the stage's first forward of the step, if it ran
  bool first_of_stage = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = weights_cast_.find(a.stage);
    first_of_stage = it == weights_cast_.end();
    if (!first_of_stage) cast_by = it->second;
  }
  if (cast_once) RankStreams::wait(cast_by);
  gpu_span_begin(span);
  at::Tensor out;
  {
    std::optional<WeightCastCache::Use> use_casts;
    if (cast_once) use_casts.emplace(weight_casts_);
    out = st.forward(a.microbatch, ctx_.microbatches[static_cast<size_t>(a.microbatch)], activation);
  }
  gpu_span_end(span);
  auto done = streams_.record_ready();
  span.finished = done;
  std::lock_guard<std::mutex> lock(mu_);
  if (first_of_stage) weights_cast_[a.stage] = done;
  if (asynchronous()) last_forward_[a.stage] = done;
  forward_done_[{a.stage, a.microbatch}] = done;
  if (!st.spec().is_last()) activations_out_[{a.stage, a.microbatch}] = Message{out, done};
}

void ActionRunner::backward(const Action& a, GpuSpan& span) {
  auto scope = streams_.enter(a.type, stream_microbatch(a));
  StageRuntime& st = stage(a.stage);
  std::shared_ptr<const ReadyEvent> forward_done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = forward_done_.find({a.stage, a.microbatch}); it != forward_done_.end()) {
      forward_done = it->second;
      forward_done_.erase(it);
    }
  }
  RankStreams::wait(forward_done);
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
  RankStreams::wait(grads_accumulated());
  if (asynchronous()) RankStreams::wait(last_forward(a.stage));  // no forward still reads what B writes
  gpu_span_begin(span);
  at::Tensor input_grad = a.type == ActionType::kBackward ? st.backward(a.microbatch, output_grad)
                                                          : st.backward_input(a.microbatch, output_grad);
  // asp: the stage's update follows its backward at once, on this stream (the next F of the
  // stage, on another stream, waits for it through the weights-ready event below).
  if (a.type == ActionType::kBackward && ctx_.update_after_backward) ctx_.update_after_backward(a.stage, a.microbatch);
  // Replicas: the rest of the stage's gradient all-reduce starts here, on this stream (ordered
  // after the backward's kernels).
  if (ctx_.after_last_gradient && is_last_gradient(a)) ctx_.after_last_gradient(a.stage);
  gpu_span_end(span);  // autograd made this stream wait for the backward kernels it ran on F(mb)'s stream
  auto accumulated = streams_.record_ready();
  span.finished = accumulated;
  auto sent = st.spec().is_first() ? nullptr : streams_.record_ready();
  std::lock_guard<std::mutex> lock(mu_);
  if (asynchronous()) last_write_[a.stage] = accumulated;
  grads_accumulated_ = std::move(accumulated);
  if (!st.spec().is_first()) grads_out_[{a.stage, a.microbatch}] = Message{input_grad, std::move(sent)};
}

void ActionRunner::backward_weight(const Action& a, GpuSpan& span) {
  // Every W runs on the rank's one W stream (RankStreams::enter), and waits for earlier B's, so
  // the g.add_ into .grad of different micro-batches is ordered.
  auto scope = streams_.enter(a.type, stream_microbatch(a));
  RankStreams::wait(grads_accumulated());
  gpu_span_begin(span);
  stage(a.stage).backward_weight(a.microbatch);
  if (ctx_.after_last_gradient && is_last_gradient(a)) ctx_.after_last_gradient(a.stage);
  gpu_span_end(span);
  auto accumulated = streams_.record_ready();
  span.finished = accumulated;
  std::lock_guard<std::mutex> lock(mu_);
  grads_accumulated_ = std::move(accumulated);
}

bool ActionRunner::is_last_gradient(const Action& a) const {
  auto it = last_gradient_action_.find(a.stage);
  return it != last_gradient_action_.end() && it->second == a;
}

std::shared_ptr<const ReadyEvent> ActionRunner::last_forward(int stage) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = last_forward_.find(stage);
  return it == last_forward_.end() ? nullptr : it->second;
}

std::shared_ptr<const ReadyEvent> ActionRunner::last_write(int stage) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = last_write_.find(stage);
  return it == last_write_.end() ? nullptr : it->second;
}

std::shared_ptr<const ReadyEvent> ActionRunner::grads_accumulated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return grads_accumulated_;
}

// Sends and receives run on the rank's thread only (never inside an overlapped pair: its halves'
// posted receives are taken before it starts, receive_input); the maps are still locked, since a
// pair's halves may have been writing them until just before.
void ActionRunner::send_forward(const Action& a) {
  Message out = take_output(activations_out_, {a.stage, a.microbatch}, "forward");
  ctx_.transport->send({TransferKind::kActivation, a.stage + 1, a.microbatch}, std::move(out));
}

void ActionRunner::recv_forward(const Action& a) {
  post_or_recv({TransferKind::kActivation, a.stage, a.microbatch}, activations_in_);
}

void ActionRunner::send_backward(const Action& a) {
  Message out = take_output(grads_out_, {a.stage, a.microbatch}, "backward");
  ctx_.transport->send({TransferKind::kGradient, a.stage - 1, a.microbatch}, std::move(out));
}

void ActionRunner::recv_backward(const Action& a) {
  post_or_recv({TransferKind::kGradient, a.stage, a.microbatch}, grads_in_);
}

void ActionRunner::post_or_recv(const TransferKey& key, std::map<Key, Message>& inbox) {
  if (ctx_.transport->recv_waits_on_host(key)) {
    std::lock_guard<std::mutex> lock(mu_);
    posted_.insert(key);
    return;
  }
  Message in = ctx_.transport->recv(key, options_.recv_timeout);
  std::lock_guard<std::mutex> lock(mu_);
  inbox[{key.stage, key.microbatch}] = std::move(in);
}

void ActionRunner::receive_posted(const TransferKey& key, std::map<Key, Message>& inbox) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (posted_.erase(key) == 0) return;
  }
  Message in = ctx_.transport->recv(key, options_.recv_timeout);  // mu_ not held: the other half may run
  std::lock_guard<std::mutex> lock(mu_);
  inbox[{key.stage, key.microbatch}] = std::move(in);
}

void ActionRunner::receive_input(const Action& a) {
  try {
    if (a.type == ActionType::kForward) {
      receive_posted({TransferKind::kActivation, a.stage, a.microbatch}, activations_in_);
    } else if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) {
      receive_posted({TransferKind::kGradient, a.stage, a.microbatch}, grads_in_);
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("rank {} action {}: {}", rank_, to_string(a), e.what()));
  }
}

Message ActionRunner::take_output(std::map<Key, Message>& outbox, Key key, const char* producer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = outbox.find(key);
  if (it == outbox.end()) {
    throw std::logic_error(fmt::format("nothing to send: {} of stage {}, micro-batch {} has not run", producer, key.first,
                                       key.second));
  }
  Message m = std::move(it->second);
  outbox.erase(it);
  return m;
}

void ActionRunner::check_drained() const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t left =
      activations_in_.size() + activations_out_.size() + grads_in_.size() + grads_out_.size() + posted_.size();
  if (left != 0) {
    throw std::logic_error(fmt::format("rank {}: {} tensor(s) were produced or received but never used "
                                       "(the schedule is missing sends or computes)", rank_, left));
  }
}

}  // namespace gpipe
