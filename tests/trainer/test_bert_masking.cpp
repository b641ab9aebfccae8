// BERT's masking: 15% of the positions of every sequence chosen, of those 80% [MASK], 10% a
// random token, 10% unchanged; targets the original ids there and -100 elsewhere; deterministic
// per (seed, epoch, index). The registered datasets and the [MASK] id after the tokenizer's ids.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "bert/bert_masking.h"
#include "trainer/data/tokenizer.h"
#include "trainer/model/registry.h"

namespace gpipe::test {
namespace {

constexpr int64_t kMask = 257;

at::Tensor random_ids(int64_t batch, int64_t time, int64_t vocab, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {batch, time}, generator, at::kLong);
}

TEST(BertMasking, FifteenPercentOfEverySequenceWithTheEightyTenTenSplit) {
  const int64_t batch = 64, time = 128, vocab = 257;
  const at::Tensor ids = random_ids(batch, time, vocab, 1);
  const Batch masked = bert::mask_tokens(ids, kMask, vocab, 42);
  ASSERT_EQ(masked.input_ids.sizes(), ids.sizes());
  ASSERT_EQ(masked.targets.sizes(), ids.sizes());
  const at::Tensor chosen = masked.targets.ne(-100);
  // Exactly round(0.15 * 128) = 19 per sequence.
  EXPECT_EQ(bert::masked_positions_per_sequence(time), 19);
  EXPECT_TRUE(at::equal(chosen.sum(1), at::full({batch}, 19, at::kLong)));
  // Targets: the original ids where chosen, -100 elsewhere.
  EXPECT_TRUE(at::equal(masked.targets.masked_select(chosen), ids.masked_select(chosen)));
  // Unchosen positions keep their token.
  EXPECT_TRUE(at::equal(masked.input_ids.masked_select(chosen.logical_not()), ids.masked_select(chosen.logical_not())));
  const double n = chosen.sum().item<double>();  // 1216
  const at::Tensor inputs = masked.input_ids.masked_select(chosen), originals = ids.masked_select(chosen);
  const double as_mask = inputs.eq(kMask).sum().item<double>() / n;
  const double unchanged = inputs.eq(originals).sum().item<double>() / n;
  const double random = 1.0 - as_mask - unchanged;
  // Binomial standard deviations at n = 1216: 1.1% (80%), 0.9% (10%); 4 sigma bounds. A random
  // token equal to the original (1 in 257) counts as unchanged.
  EXPECT_NEAR(as_mask, 0.8, 0.046);
  EXPECT_NEAR(unchanged, 0.1 + 0.1 / 257, 0.035);
  EXPECT_NEAR(random, 0.1, 0.035);
  // [MASK] appears only at chosen positions; random tokens are real tokens, never [MASK].
  EXPECT_EQ(masked.input_ids.eq(kMask).logical_and(chosen.logical_not()).sum().item<int64_t>(), 0);
  EXPECT_LT(masked.input_ids.max().item<int64_t>(), kMask + 1);
  // Positions are spread over the sequence (not, say, always the first 19).
  const at::Tensor per_position = chosen.sum(0).to(at::kDouble);
  EXPECT_GT(per_position.min().item<double>(), 0.0);
  EXPECT_NEAR(per_position.mean().item<double>(), 64 * 0.1484375, 1e-9);
}

TEST(BertMasking, ShortSequencesStillPredictSomething) {
  EXPECT_EQ(bert::masked_positions_per_sequence(1), 1);
  EXPECT_EQ(bert::masked_positions_per_sequence(3), 1);
  EXPECT_EQ(bert::masked_positions_per_sequence(10), 2);  // round(1.5)
  const Batch masked = bert::mask_tokens(random_ids(8, 4, 10, 2), 10, 10, 7);
  EXPECT_TRUE(at::equal(masked.targets.ne(-100).sum(1), at::ones({8}, at::kLong)));
}

TEST(BertMasking, DeterministicPerSeedEpochAndIndex) {
  const at::Tensor ids = random_ids(4, 32, 257, 3);
  const Batch a = bert::mask_tokens(ids, kMask, 257, bert::masking_seed(1234, 0, 5));
  const Batch again = bert::mask_tokens(ids, kMask, 257, bert::masking_seed(1234, 0, 5));
  EXPECT_TRUE(at::equal(a.input_ids, again.input_ids));
  EXPECT_TRUE(at::equal(a.targets, again.targets));
  for (uint64_t other : {bert::masking_seed(1235, 0, 5), bert::masking_seed(1234, 1, 5), bert::masking_seed(1234, 0, 6),
                         bert::masking_seed(1234, 5, 0)}) {
    EXPECT_NE(other, bert::masking_seed(1234, 0, 5));
    EXPECT_FALSE(at::equal(a.targets, bert::mask_tokens(ids, kMask, 257, other).targets));
  }
}

TEST(BertMasking, TokenizerAddsMaskAfterTheVocabulary) {
  DatasetConfig dataset;
  bert::MaskedTokenizer tokenizer(make_tokenizer(dataset));
  EXPECT_EQ(tokenizer.vocab_size(), 258);
  EXPECT_EQ(tokenizer.mask_id(), 257);
  EXPECT_EQ(tokenizer.eot_id(), std::optional<int64_t>(256));
  EXPECT_EQ(tokenizer.encode("hi"), (std::vector<int64_t>{'h', 'i'}));
  EXPECT_EQ(tokenizer.decode({'h', 257, 'i'}), "h[MASK]i");
}

TEST(BertMasking, RegisteredDatasetsMaskTheEmbeddedCorpus) {
  for (const char* name : {"bert", "bert_code_search_net", "bert_text"}) {
    auto dataset = dataset_registry().create(name);
    DatasetConfig config;
    config.name = name;
    config.batch_size = 4;
    ModelConfig model;
    model.sequence_length = 64;
    dataset->set_seed(9);
    dataset->load_dataset(config, model);
    EXPECT_EQ(dataset->get_tokenizer().vocab_size(), 258) << name;
    ASSERT_GE(dataset->num_batches(), 2) << name;
    const Batch a = dataset->process_batch(0, 1), again = dataset->process_batch(0, 1);
    EXPECT_TRUE(at::equal(a.input_ids, again.input_ids)) << name;
    EXPECT_TRUE(at::equal(a.targets, again.targets)) << name;
    EXPECT_EQ(a.input_ids.sizes(), (std::vector<int64_t>{4, 64})) << name;
    EXPECT_TRUE(at::equal(a.targets.ne(-100).sum(1), at::full({4}, 10, at::kLong))) << name;  // round(9.6)
    EXPECT_GT(a.input_ids.eq(257).sum().item<int64_t>(), 0) << name;
    EXPECT_FALSE(at::equal(a.targets, dataset->process_batch(1, 1).targets)) << name;
  }
  // vocab_size too small for [MASK] is refused with the reason.
  auto dataset = dataset_registry().create("bert");
  DatasetConfig config;
  ModelConfig model;
  model.vocab_size = 257;
  try {
    dataset->load_dataset(config, model);
    FAIL() << "model.vocab_size 257 leaves no id for [MASK]";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("[MASK]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gpipe::test
