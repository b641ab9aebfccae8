// The registered BERT, pipelined by every schedule the GPT's equivalence test covers (and the
// V-placed ones, whose first rank holds both the embedding and the MLM head on different
// stages), with both executors, with and without activation recomputation, matches the
// unpipelined BERT after one step: the masked-LM loss and every parameter gradient, the two
// copies of the tied word embeddings included (each must hold the sum of both uses' gradients),
// within rtol 1e-4, atol 1e-5 (fp32). Over several optimizer steps the copies stay identical
// and the pipeline trains as the one-stage model does.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <map>
#include <string>
#include <tuple>

#include "bert/bert_masking.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/model/registry.h"
#include "trainer/training/trainer.h"

namespace gpipe {
namespace {

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;
constexpr int64_t kVocab = 40;  // the last id is [MASK]

PipelineConfig tiny_bert(const std::string& schedule, double recompute, const std::string& executor) {
  PipelineConfig c;
  c.model.name = "bert";
  c.model.hidden_size = 32;
  c.model.num_layers = 4;
  c.model.num_heads = 2;
  c.model.sequence_length = 8;
  c.model.vocab_size = kVocab;
  c.dataset.name = "bert";
  c.dataset.batch_size = 8;
  c.training.num_microbatches = 4;
  c.training.seed = 5;
  c.parallel.model_parallel_size = 2;
  const bool two_stages_per_rank = schedule == "interleaved_1f1b" || schedule == "zbv" || schedule == "dualpipev";
  c.parallel.virtual_stages = two_stages_per_rank ? 2 : 1;
  c.parallel.schedule = schedule;
  c.parallel.scheduler = executor;
  c.parallel.device = "cpu";
  if (recompute > 0) c.parallel.recompute_ratio = {recompute};
  return c;
}

Batch masked_batch(const PipelineConfig& c, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor ids = at::randint(kVocab - 1, {c.dataset.batch_size, c.model.sequence_length}, generator, at::kLong);
  return bert::mask_tokens(ids, kVocab - 1, kVocab - 1, seed);
}

// A pipelined parameter's name in the one-stage model: the head's copy of the tied weight is
// the embedding's word_embeddings there.
std::string reference_name(const std::string& name) {
  return name == "head.decoder.weight" ? "embedding.word_embeddings.weight" : name;
}

using Param = std::tuple<std::string, double, std::string>;
class BertEquivalenceTest : public ::testing::TestWithParam<Param> {};

TEST_P(BertEquivalenceTest, OneStepMatchesUnpipelined) {
  at::set_num_threads(1);
  const auto [schedule, recompute, executor] = GetParam();
  PipelineConfig c = tiny_bert(schedule, recompute, executor);
  const Batch batch = masked_batch(c, 3);

  // Reference: one stage holding every layer (one tied tensor), the whole batch at once.
  auto model = model_registry().create("bert");
  auto stage = stage_registry().create("bert");
  model->configure(c.model);
  const StageSpec all{0, 1, 0, static_cast<int64_t>(model->layer_costs().size()), 0.0};
  auto reference = stage->create_sub_model(*model, all, c.training.seed);
  at::Tensor ref_loss = stage->compute_loss(reference->forward(stage->prepare_input(batch)), batch);
  ref_loss.backward();
  std::map<std::string, at::Tensor> ref_params;
  for (const auto& item : reference->named_parameters()) ref_params[item.key()] = item.value();

  PipelineComponents parts;
  parts.model = model_registry().create("bert");
  parts.stage = stage_registry().create("bert");
  PipelineTrainer trainer(c, std::move(parts));
  const double loss = trainer.forward_backward(batch);
  EXPECT_NEAR(loss, ref_loss.item<double>(), kAtol + kRtol * std::abs(ref_loss.item<double>()));

  size_t compared = 0, tied_copies = 0;
  for (const auto& st : trainer.stages()) {
    for (const auto& item : st->module().named_parameters()) {
      const std::string name = reference_name(item.key());
      tied_copies += name != item.key() || item.key() == "embedding.word_embeddings.weight";
      auto it = ref_params.find(name);
      ASSERT_NE(it, ref_params.end()) << "stage " << st->spec().stage << " parameter " << item.key();
      const at::Tensor& p = item.value();
      ASSERT_TRUE(p.grad().defined()) << item.key() << " has no gradient";
      ASSERT_EQ(p.sizes(), it->second.sizes()) << item.key();
      EXPECT_TRUE(at::equal(p, it->second)) << item.key() << " starts from other weights";
      EXPECT_TRUE(at::allclose(p.grad(), it->second.grad(), kRtol, kAtol))
          << "stage " << st->spec().stage << " " << item.key() << " max abs diff "
          << (p.grad() - it->second.grad()).abs().max().item<double>();
      ++compared;
    }
  }
  EXPECT_EQ(tied_copies, 2u) << "the embedding and the head must be on different stages";
  EXPECT_EQ(compared, ref_params.size() + 1);  // every parameter, the tied one twice
}

INSTANTIATE_TEST_SUITE_P(Schedules, BertEquivalenceTest,
                         ::testing::Combine(::testing::Values("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv",
                                                              "dualpipev"),
                                            ::testing::Values(0.0, 1.0),
                                            ::testing::Values("async_threaded", "naive")),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) > 0 ? "_recompute" : "") + "_" +
                                  std::get<2>(info.param);
                         });

// The copies of the tied weight, one step after another: identical (bitwise) on both stages,
// moved from their start, and the pipeline's losses and gradient norms those of a one-stage run
// (whose norm counts the tied weight once, as the pipeline's must).
TEST(BertTiedWeights, CopiesStayEqualOverOptimizerStepsAndTrainLikeOneStage) {
  at::set_num_threads(1);
  auto run = [](int ranks, const std::string& schedule, std::vector<at::Tensor>* copies) {
    PipelineConfig c = tiny_bert(schedule, 0.0, "async_threaded");
    c.parallel.model_parallel_size = ranks;
    c.training.learning_rate = 1e-2;
    c.training.grad_clip = 0.5;  // clipping active: the norm must count the tied weight once
    c.training.max_steps = 4;
    PipelineComponents parts;
    parts.model = model_registry().create("bert");
    parts.stage = stage_registry().create("bert");
    PipelineTrainer trainer(c, std::move(parts));
    auto find = [&](int stage, int64_t layer, const char* name) {
      return trainer.stages().at(static_cast<size_t>(stage))->module().layer_parameter(layer, name);
    };
    const int last = trainer.schedule().num_stages() - 1;
    const at::Tensor embedding = find(0, 0, "word_embeddings.weight"), decoder = find(last, 5, "decoder.weight");
    EXPECT_TRUE(embedding.defined() && decoder.defined());
    EXPECT_EQ(embedding.is_same(decoder), last == 0);
    const at::Tensor start = embedding.detach().clone();
    std::vector<std::pair<double, double>> history;
    for (int step = 0; step < 4; ++step) {
      const double loss = trainer.forward_backward(masked_batch(c, 10 + static_cast<uint64_t>(step)));
      EXPECT_TRUE(at::equal(embedding.grad(), decoder.grad())) << "step " << step;
      const auto [norm, lr] = trainer.optimizer_step(step);
      EXPECT_TRUE(at::equal(embedding, decoder)) << "step " << step << " max abs diff "
                                                 << (embedding - decoder).abs().max().item<double>();
      history.emplace_back(loss, norm);
    }
    EXPECT_GT((embedding - start).abs().max().item<double>(), 1e-3) << "the tied weight did not train";
    copies->push_back(embedding.detach().clone());
    return history;
  };
  std::vector<at::Tensor> finals;
  const auto one = run(1, "1f1b", &finals);
  for (const auto& [ranks, schedule] : std::vector<std::pair<int, std::string>>{{2, "1f1b"}, {4, "gpipe"}, {2, "zbv"}}) {
    SCOPED_TRACE(schedule + " on " + std::to_string(ranks) + " ranks");
    const auto piped = run(ranks, schedule, &finals);
    ASSERT_EQ(piped.size(), one.size());
    for (size_t s = 0; s < one.size(); ++s) {
      EXPECT_NEAR(piped[s].first, one[s].first, 1e-4 * std::abs(one[s].first)) << "loss at step " << s;
      EXPECT_NEAR(piped[s].second, one[s].second, 1e-4 * one[s].second) << "gradient norm at step " << s;
    }
    EXPECT_TRUE(at::allclose(finals.back(), finals.front(), 1e-3, 1e-5)) << "the tied weight after 4 steps";
  }
  EXPECT_GT(one.front().second, 0.5) << "clipping must have been active for the norm to matter";
}

TEST(BertTiedWeights, ParameterCountCountsTheTiedWeightOnce) {
  PipelineConfig c = tiny_bert("1f1b", 0.0, "async_threaded");
  PipelineComponents parts;
  parts.model = model_registry().create("bert");
  parts.stage = stage_registry().create("bert");
  auto model = model_registry().create("bert");
  model->configure(c.model);
  PipelineTrainer trainer(c, std::move(parts));
  int64_t held = 0;
  for (const auto& st : trainer.stages())
    for (const auto& p : st->parameters()) held += p.numel();
  EXPECT_EQ(held - trainer.num_parameters(), kVocab * 32);
  int64_t one_stage = 0;
  const StageSpec all{0, 1, 0, static_cast<int64_t>(model->layer_costs().size()), 0.0};
  for (const auto& p : stage_registry().create("bert")->create_sub_model(*model, all, 1)->parameters()) one_stage += p.numel();
  EXPECT_EQ(trainer.num_parameters(), one_stage);
}

}  // namespace
}  // namespace gpipe
