// The registered GPT, pipelined by every schedule (async executor; with and without activation
// recomputation), matches the unpipelined GPT after one step: loss and every parameter gradient
// within rtol 1e-4, atol 1e-5 (fp32).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <string>
#include <tuple>

#include "trainer/model/registry.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/training/trainer.h"

namespace gpipe {
namespace {

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

PipelineConfig tiny_gpt(const std::string& schedule, double recompute) {
  PipelineConfig c;
  c.model.name = "gpt";
  c.model.hidden_size = 32;
  c.model.num_layers = 4;
  c.model.num_heads = 2;
  c.model.sequence_length = 8;
  c.model.vocab_size = 40;
  c.dataset.batch_size = 8;
  c.training.num_microbatches = 4;
  c.training.seed = 5;
  c.parallel.model_parallel_size = 2;
  c.parallel.virtual_stages = schedule == "interleaved_1f1b" ? 2 : 1;
  c.parallel.schedule = schedule;
  c.parallel.scheduler = "async_threaded";
  c.parallel.device = "cpu";
  if (recompute > 0) c.parallel.recompute_ratio = {recompute};
  return c;
}

using Param = std::tuple<std::string, double>;
class GptEquivalenceTest : public ::testing::TestWithParam<Param> {};

TEST_P(GptEquivalenceTest, OneStepMatchesUnpipelined) {
  at::set_num_threads(1);
  const auto [schedule, recompute] = GetParam();
  PipelineConfig c = tiny_gpt(schedule, recompute);
  at::manual_seed(3);
  const at::Tensor tokens = at::randint(c.model.vocab_size, {c.dataset.batch_size, c.model.sequence_length + 1}, at::kLong);
  const Batch batch{tokens.narrow(1, 0, c.model.sequence_length).contiguous(),
                    tokens.narrow(1, 1, c.model.sequence_length).contiguous()};

  // Reference: one stage holding every layer, the whole batch at once.
  auto model = model_registry().create("gpt");
  auto stage = stage_registry().create("gpt");
  model->configure(c.model);
  const StageSpec all{0, 1, 0, static_cast<int64_t>(model->layer_costs().size()), 0.0};
  auto reference = stage->create_sub_model(*model, all, c.training.seed);
  at::Tensor ref_loss = stage->compute_loss(reference->forward(stage->prepare_input(batch)), batch);
  ref_loss.backward();
  const auto ref_params = reference->parameters();

  PipelineComponents parts;
  parts.model = model_registry().create("gpt");
  parts.stage = stage_registry().create("gpt");
  PipelineTrainer trainer(c, std::move(parts));
  const double loss = trainer.forward_backward(batch);
  EXPECT_NEAR(loss, ref_loss.item<double>(), kAtol + kRtol * std::abs(ref_loss.item<double>()));

  size_t i = 0;
  for (const auto& st : trainer.stages()) {
    for (const auto& p : st->parameters()) {
      ASSERT_LT(i, ref_params.size());
      ASSERT_TRUE(p.grad().defined()) << "parameter " << i << " has no gradient";
      ASSERT_EQ(p.sizes(), ref_params[i].sizes()) << "parameter " << i;
      EXPECT_TRUE(at::allclose(p.grad(), ref_params[i].grad(), kRtol, kAtol))
          << "parameter " << i << " max abs diff " << (p.grad() - ref_params[i].grad()).abs().max().item<double>();
      ++i;
    }
  }
  EXPECT_EQ(i, ref_params.size());
}

INSTANTIATE_TEST_SUITE_P(Schedules, GptEquivalenceTest,
                         ::testing::Combine(::testing::Values("gpipe", "1f1b", "interleaved_1f1b", "zb_h1"),
                                            ::testing::Values(0.0, 1.0)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) > 0 ? "_recompute" : "");
                         });

}  // namespace
}  // namespace gpipe
