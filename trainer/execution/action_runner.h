// Private to the executors: one rank's action methods (DeepSpeed style, one per action type)
// and the per-step state they pass along: received and outgoing tensors and their ready events.
#pragma once

#include <c10/core/AutogradState.h>

#include <map>
#include <memory>
#include <utility>

#include "trainer/device/device.h"
#include "trainer/execution/executor.h"
#include "trainer/distributed/transport.h"

namespace gpipe {

class ActionRunner {
 public:
  ActionRunner(const StepContext& ctx, int rank, RankStreams& streams, const ExecutorOptions& options);
  // Runs one action of this rank's program and records its span. Exceptions carry the rank and
  // the action.
  void run(const Action& action);
  // Throws std::logic_error if tensors were produced but never consumed (a schedule bug).
  void check_drained() const;

 private:
  using Key = std::pair<int, int>;  // (virtual stage, micro-batch)
  void forward(const Action& a);
  void backward(const Action& a);
  void backward_input(const Action& a);
  void backward_weight(const Action& a);
  void send_forward(const Action& a);
  void recv_forward(const Action& a);
  void send_backward(const Action& a);
  void recv_backward(const Action& a);
  void dispatch(const Action& a);
  // The received tensor for (stage, mb); when the neighbour stage lives on this rank and the
  // schedule has no send/receive for it, takes the neighbour's output directly.
  Message take_input(std::map<Key, Message>& inbox, std::map<Key, Message>& neighbour_outbox, Key key,
                     Key neighbour_key, const char* what);
  at::Tensor ready_tensor(const Message& m);
  StageRuntime& stage(int s) const;

  const StepContext& ctx_;
  int rank_;
  RankStreams& streams_;
  const ExecutorOptions& options_;
  std::map<Key, Message> activations_in_, activations_out_, grads_in_, grads_out_;
  std::map<Key, std::shared_ptr<const ReadyEvent>> forward_done_;
  // Recorded after each action that adds into parameter .grad (B, W); the next such action's
  // stream waits on it, so accumulation across micro-batch streams is ordered (see backward()).
  std::shared_ptr<const ReadyEvent> grads_accumulated_;
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

// The two executors (naive_executor.cpp, async_executor.cpp), for make_executor.
std::unique_ptr<Executor> make_naive_executor(ExecutorOptions options);
std::unique_ptr<Executor> make_async_threaded_executor(ExecutorOptions options);

}  // namespace gpipe
