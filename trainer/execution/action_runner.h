// Private to the executors: one rank's action methods (DeepSpeed style, one per action type)
// and the per-step state they pass along: received and outgoing tensors and their ready events.
#pragma once

#include <c10/core/AutogradState.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "trainer/device/device.h"
#include "trainer/execution/executor.h"
#include "trainer/distributed/transport.h"
#include "trainer/metrics/timeline.h"
#include "trainer/model/weight_grad_store.h"

namespace gpipe {

class ActionRunner {
 public:
  // `gpu_step_mark` (a CUDA rank, with a recorder): the step's timing event on the rank's device,
  // recorded before any of the step's work; each action's span is then also timed on the GPU.
  ActionRunner(const StepContext& ctx, int rank, RankStreams& streams, const ExecutorOptions& options,
               std::shared_ptr<const TimingEvent> gpu_step_mark = nullptr);
  // Runs one action of this rank's program and records its span (on `lane`'s track). Exceptions
  // carry the rank and the action. The two halves of an overlapped pair may run at once, the
  // forward on the rank's forward lane and the backward on the rank's thread: they share only the
  // tensor maps below (under mu_) and no (stage, micro-batch); everything else runs on one thread.
  void run(const Action& action, ActionLane lane = ActionLane::kRank);
  // Takes the input of compute action `a` from the transport if the schedule posted its receive
  // and it is not here yet (waits for it): an overlapped pair's halves call no transport. Errors
  // carry the rank and the action, as run()'s do.
  void receive_input(const Action& a);
  // Throws std::logic_error if tensors were produced but never consumed (a schedule bug).
  void check_drained() const;

 private:
  using Key = std::pair<int, int>;  // (virtual stage, micro-batch)
  // One action's GPU-clock span (its two timing events), per call: two actions may be in flight.
  // `finished` (a GPU compute action): recorded after its last kernel, for the bubble publisher.
  struct GpuSpan {
    std::shared_ptr<const TimingEvent> start, end;
    std::shared_ptr<const ReadyEvent> finished;
  };
  void forward(const Action& a, GpuSpan& span);
  void backward(const Action& a, GpuSpan& span);  // B and I
  void backward_weight(const Action& a, GpuSpan& span);
  void send_forward(const Action& a);
  void recv_forward(const Action& a);
  void send_backward(const Action& a);
  void recv_backward(const Action& a);
  // A receive action: taken from the transport now, or posted (posted_) when taking it would
  // wait on the host: the compute that needs it takes it (receive_posted).
  void post_or_recv(const TransferKey& key, std::map<Key, Message>& inbox);
  void receive_posted(const TransferKey& key, std::map<Key, Message>& inbox);
  void dispatch(const Action& a, GpuSpan& span);
  // The received tensor for (stage, mb); when the neighbour stage lives on this rank and the
  // schedule has no send/receive for it, takes the neighbour's output directly. Locks mu_.
  Message take_input(std::map<Key, Message>& inbox, std::map<Key, Message>& neighbour_outbox, Key key,
                     Key neighbour_key, const char* what);
  // Removes and returns what a send ships: F's activation or B/I's input gradient. Locks mu_.
  Message take_output(std::map<Key, Message>& outbox, Key key, const char* producer);
  // The stage's last .grad-writing action of this rank's program (see last_gradient_action_).
  bool is_last_gradient(const Action& a) const;
  std::shared_ptr<const ReadyEvent> last_forward(int stage) const;
  std::shared_ptr<const ReadyEvent> last_write(int stage) const;
  std::shared_ptr<const ReadyEvent> grads_accumulated() const;  // locks mu_
  at::Tensor ready_tensor(const Message& m);
  StageRuntime& stage(int s) const;
  // GPU clock: a compute action marks its span on its own stream, after its input waits (so the
  // span starts when its stream may run it) and after its last kernel; run() marks a send or a
  // receive on the current stream around it. No-ops without a step mark.
  void gpu_span_begin(GpuSpan& span);
  void gpu_span_end(GpuSpan& span);

  const StepContext& ctx_;
  int rank_;
  RankStreams& streams_;
  const ExecutorOptions& options_;
  // Guards the maps below and grads_accumulated_ (held only to look up and store, never across
  // compute or communication).
  mutable std::mutex mu_;
  std::map<Key, Message> activations_in_, activations_out_, grads_in_, grads_out_;
  std::set<TransferKey> posted_;  // receives posted and not taken yet
  std::map<Key, std::shared_ptr<const ReadyEvent>> forward_done_;
  // Recorded after each action that adds into parameter .grad (B, W); the next such action's
  // stream waits on it, so accumulation across micro-batch streams is ordered (see backward()).
  std::shared_ptr<const ReadyEvent> grads_accumulated_;
  std::shared_ptr<const TimingEvent> gpu_step_mark_;
  // bf16: split_linear's weight copies, made once per step (the runner lives one step) by each
  // stage's first forward; every later forward of the stage waits for that one's event. The copies
  // die with the runner, after the executor synchronised the devices. Only forwards touch them,
  // and a rank runs one forward at a time (a pair has one).
  WeightCastCache weight_casts_;
  std::map<int, std::shared_ptr<const ReadyEvent>> weights_cast_;  // stage -> its first forward's end
  // asp (ctx_.update_after_backward set): a stage's parameters change between its actions. Its
  // forwards share one stream and its backwards another (micro-batch 0's), a forward waits for
  // the stage's last write (a B's swap or update), a backward (which swaps and updates) for the
  // stage's last forward; the bf16 cast cache is off (it would keep the step's first weights).
  bool asynchronous() const { return static_cast<bool>(ctx_.update_after_backward); }
  int stream_microbatch(const Action& a) const { return asynchronous() ? 0 : a.microbatch; }
  std::map<int, std::shared_ptr<const ReadyEvent>> last_forward_, last_write_;  // by stage
  // Per stage of this rank: its program's last action that writes .grad (B, I or W), for
  // ctx_.before_last_gradient / after_last_gradient.
  std::map<int, Action> last_gradient_action_;
};

// LibTorch hands the backward of a CUDA graph to one autograd worker thread per device, shared by
// every thread of the process: the backward launches of all co-located ranks would go through that
// one CPU thread, and a scheduler could not tell backward work by its calling thread. With
// multithreading off on the calling thread, the engine runs the backward right there, on the
// rank's own thread (CPU backward already runs on the calling thread). Restores the setting.
class BackwardOnCallingThread {
 public:
  BackwardOnCallingThread() : previous_(c10::AutogradState::get_tls_state().get_multithreading_enabled()) {
    c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
  }
  ~BackwardOnCallingThread() { c10::AutogradState::get_tls_state().set_multithreading_enabled(previous_); }
  BackwardOnCallingThread(const BackwardOnCallingThread&) = delete;
  BackwardOnCallingThread& operator=(const BackwardOnCallingThread&) = delete;

 private:
  bool previous_;
};

// The step's GPU-clock zero, per rank (indexed by rank): one timing event per CUDA device of this
// process, recorded on the calling thread's current stream, shared by the ranks on that device.
// Record it before the step's work (RankStreams::begin_step); all null without a recorder or on
// CPU (the timeline then uses the host clock).
std::vector<std::shared_ptr<const TimingEvent>> record_gpu_step_marks(const StepContext& ctx);

// The end of a step, both executors. After a failed step: the devices finish what may still read
// the step's buffers (a failing device may refuse; the step's own error is what the caller needs),
// then what the step left in the transport is dropped, so the next step does not find this one's
// messages; returns how many were dropped. After a step that ran through: an abort during it (a
// monitor's or the NCCL watchdog's) fails it, as does a message sent and never received (the
// schedule's sends and receives do not match); either is thrown after a reset.
size_t discard_failed_step(const StepContext& ctx);
void check_transport_drained(const StepContext& ctx);

// The two executors (naive_executor.cpp, async_executor.cpp), for make_executor.
std::unique_ptr<Executor> make_naive_executor(ExecutorOptions options);
std::unique_ptr<Executor> make_async_threaded_executor(ExecutorOptions options);

}  // namespace gpipe
