// Per-layer timings for parallel.partition=time: each layer of the model (layer_costs() order:
// embedding, blocks, head) is built alone as a one-layer stage module through the model's
// StageInterface and timed forward + backward on one micro-batch-shaped input.
#pragma once

#include <functional>

#include <c10/core/Device.h>

#include <vector>

#include "trainer/config/config.h"
#include "trainer/model/interfaces.h"

namespace gpipe {

struct LayerProfileOptions {
  int warmup_runs = 2;  // untimed rounds over all layers (allocator, kernels, caches); at least 1 runs
  int timed_runs = 7;   // timed rounds; each layer's median is reported
  bool bf16_autocast = false;  // time under bf16 autocast (CUDA only, as the executors run it)
  // Called after each round over all layers (warm-up and timed alike) with the rounds done and
  // the rounds in all, so a long profile can say how far it is. May be empty.
  std::function<void(int done, int total)> on_round;
};

// Milliseconds of forward + backward of each layer alone, one entry per layer of
// model.layer_costs() (the model must be configured). Layer i runs as
// stage.create_sub_model(model, StageSpec{stage i of L+2, layers [i, i+1)}, config.training.seed)
// on `device`: the first layer gets stage.prepare_input() of random token ids of
// [dataset.batch_size / training.num_microbatches, model.sequence_length], every other layer a
// random tensor shaped like the previous layer's output (requires_grad, so its input gradient is
// timed too); the last layer's output goes through stage.compute_loss(), the others' backward
// takes a random output gradient. All layers are built first (the whole model's memory on
// `device`), then run in warm-up rounds, then in timed rounds that each time every layer once; a
// layer's result is the median of its timed runs (CUDA is synchronised around each). Random
// inputs come from a private generator seeded from training.seed; layers with dropout still draw
// from the global generator, so callers that need a reproducible run re-seed after profiling.
std::vector<double> measure_layer_ms(const ModelInterface& model, const StageInterface& stage,
                                     const PipelineConfig& config, c10::Device device,
                                     const LayerProfileOptions& options = {});

// Runs work(i) for i in [0, k) on k threads released together, one untimed warm-up round and then
// `rounds` timed rounds; returns the median wall time of the timed rounds in ms (--plan's measure
// of ranks sharing a device). The threads are made once and kept for every round, as the async
// executor keeps its rank threads: what a thread pays at its first call (cuDNN's attention graphs
// are built per CPU thread) falls in the warm-up, not in every round. Each thread is bound to
// `device`, launches on a stream of its own (a rank's own stream; on the default stream the
// threads' kernels would run one after another), has grad mode on, and runs backward on itself
// (autograd multithreading off, as the executors do), so k threads launch k backwards at once as
// k ranks do; a round ends when every thread's stream is done, so `work` should synchronize its
// own stream at most (never the whole device). The first exception of a thread is rethrown once
// every round has ended (a failing thread still meets every barrier).
double concurrent_wall_ms(int k, int rounds, c10::Device device, const std::function<void(int)>& work);

}  // namespace gpipe
