// Builders shared by the engine tests: a PipelineTrainer over the tiny test model.
#pragma once

#include <ATen/Parallel.h>

#include <memory>
#include <string>

#include "test_engine_tiny_model.h"
#include "trainer/config/config.h"
#include "trainer/training/trainer.h"

namespace gpipe::testing {

struct TinySetup {
  std::string schedule = "1f1b";
  std::string executor = "async_threaded";
  std::string overlap_f_b = "auto";
  std::string streams = "per_microbatch";
  int ranks = 2;
  int virtual_stages = 1;
  int microbatches = 4;
  int64_t batch = 8;
  int64_t seq = 6;
  int64_t vocab = 16;
  int64_t hidden = 8;
  int64_t blocks = 4;
  TinyCosts costs;
  std::string device = "cpu";
};

inline PipelineConfig tiny_config(const TinySetup& s) {
  PipelineConfig c;
  c.model.name = "tiny";
  c.model.hidden_size = s.hidden;
  c.model.num_layers = s.blocks;
  c.model.num_heads = 1;
  c.model.sequence_length = s.seq;
  c.model.vocab_size = s.vocab;
  c.dataset.batch_size = s.batch;
  c.training.num_microbatches = s.microbatches;
  c.training.grad_clip = 0;
  c.training.seed = 42;
  c.parallel.model_parallel_size = s.ranks;
  c.parallel.virtual_stages = s.virtual_stages;
  c.parallel.schedule = s.schedule;
  c.parallel.scheduler = s.executor;
  c.parallel.overlap_f_b = s.overlap_f_b;
  c.parallel.streams = s.streams;
  c.parallel.device = s.device;
  return c;
}

inline std::unique_ptr<PipelineTrainer> make_tiny_trainer(const TinySetup& s) {
  at::set_num_threads(1);
  PipelineComponents parts;
  parts.model = std::make_unique<TinyModel>(s.blocks, s.costs);
  parts.stage = std::make_unique<TinyStage>();
  return std::make_unique<PipelineTrainer>(tiny_config(s), std::move(parts));
}

}  // namespace gpipe::testing
