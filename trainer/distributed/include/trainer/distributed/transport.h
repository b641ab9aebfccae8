// Point-to-point tensor transport between pipeline stages. A tensor in flight is named by
// (kind, receiving stage, micro-batch); a receive that nobody feeds fails after a timeout with
// an error naming the peer and the key, never a hang. The in-process implementation serves the
// one-thread-per-rank executors; multi-process NCCL/Gloo transports implement the same interface.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <compare>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpipe {

class ReadyEvent;  // device.h: what a receiver's stream waits on before using the tensor
struct Placement;  // trainer/partition/placement.h

enum class TransferKind : uint8_t {
  kActivation,  // forward output of stage-1, input of `stage`
  kGradient,    // input gradient of stage+1, output gradient of `stage`
};
const char* to_string(TransferKind kind);

struct TransferKey {
  TransferKind kind = TransferKind::kActivation;
  int stage = 0;  // the receiving virtual stage
  int microbatch = 0;
  int sender_stage() const { return kind == TransferKind::kActivation ? stage - 1 : stage + 1; }
  auto operator<=>(const TransferKey&) const = default;
};
// e.g. "activation for stage 2, micro-batch 5"
std::string to_string(const TransferKey& key);

// The store keys under which the NCCL transport publishes the communicator id of pipeline ranks
// from -> to and the shape of a message, named by the world ranks (placement.process_of) of the
// processes at both ends: data-parallel replicas share pipeline rank and stage numbers, so keys
// by those alone let one replica read another's id (a communicator of three, or pairs across
// replicas training on each other's activations).
std::string nccl_id_store_key(const Placement& placement, int from_rank, int to_rank);
std::string nccl_shape_store_key(const Placement& placement, const TransferKey& key, int sender_rank);

struct Message {
  at::Tensor tensor;
  std::shared_ptr<const ReadyEvent> ready;  // null on CPU: the tensor is ready when sent
};

struct TransportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct TransportTimeout : TransportError {
  using TransportError::TransportError;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Never blocks for the receiver. Sending the same key twice before it is received is an error.
  virtual void send(const TransferKey& key, Message message) = 0;
  // Waits up to `timeout`; throws TransportTimeout naming the peer stage/rank and the key, or
  // TransportError if the transport was aborted.
  virtual Message recv(const TransferKey& key, std::chrono::milliseconds timeout) = 0;
  // Whether recv(key) waits on the host for the sender. True (in memory, Gloo): messages are
  // keyed and sends never block the sender, so the executors ask for the tensor only at the
  // compute that needs it (torch.distributed.pipelining likewise posts an irecv at RECV and waits
  // on it there), and a rank never sits at a receive while compute it could run waits behind it.
  // Gloo moves the bytes only once the receiver asks (its pair protocol), so across processes the
  // transfer starts at that compute; simulate_step counts it as done when the sender finished,
  // and under-predicts such a step by the transfers on its critical path. False (NCCL across
  // processes): the receive must be posted where the schedule has it (a communicator matches in
  // posting order) and costs the host nothing; the consumer's stream waits instead.
  virtual bool recv_waits_on_host(const TransferKey& /*key*/) const { return true; }
  // A rank failed: wake every waiting recv with TransportError(reason); later calls throw too
  // until reset().
  virtual void abort(const std::string& reason) = 0;
  // Why the transport was aborted, empty while it was not (since the last reset()). A step that
  // ran through while it was aborted is no step: NCCL transfers posted before the abort ended
  // without their data.
  virtual std::string aborted_reason() const = 0;
  // Drops undelivered messages and clears an abort; returns how many messages were dropped.
  virtual size_t reset() = 0;
  // Messages sent but not yet received (a finished step must leave none).
  virtual size_t pending() const = 0;
  // Bytes this process sent to other processes so far (payload and headers); 0 in memory.
  virtual uint64_t bytes_sent() const { return 0; }
  // Every process has finished the step (the caller knows it from a collective of the whole
  // world), so everything sent has been received: a transport that keeps its sends alive until
  // they are delivered lets them go. Gloo's send works turn complete only when waited on, so
  // without this they (and the activations and gradients they hold) were kept until the run
  // ended. Throws TransportError naming the message if one cannot be confirmed within `timeout`.
  virtual void release_delivered(std::chrono::milliseconds /*timeout*/) {}
};

// All ranks in one process. `num_ranks` and `stage_to_rank` (the schedule's placement,
// Schedule::stage_to_rank; empty: stage s on rank s % num_ranks) only name peers in errors.
std::unique_ptr<Transport> make_inprocess_transport(int num_ranks, std::vector<int> stage_to_rank = {});

}  // namespace gpipe
