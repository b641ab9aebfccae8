// Token stream -> batches: shifted targets, determinism per seed, epochs, errors; the registered
// datasets on the embedded corpus and on a text file.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include <zlib.h>

#include "temp_dir.h"
#include "trainer/model/registry.h"
#include "trainer/data/text_data.h"

namespace gpipe::test {
namespace {

std::vector<int32_t> counting_tokens(int32_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), 0);
  return tokens;
}

TEST(TokenBatcher, TargetsAreInputsShiftedByOne) {
  TokenBatcher batcher(counting_tokens(1000), 4, 16, "test");
  EXPECT_EQ(batcher.num_samples(), 999 / 16);
  EXPECT_EQ(batcher.num_batches(), (999 / 16) / 4);
  const Batch batch = batcher.batch(0, 3, 1);
  ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(batch.input_ids.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(batch.targets, batch.input_ids + 1));
  // Each row is a whole sample: it starts at a multiple of the sequence length.
  for (int64_t b = 0; b < 4; ++b) EXPECT_EQ(batch.input_ids[b][0].item<int64_t>() % 16, 0);
}

TEST(TokenBatcher, SameSeedSameBatchesOtherSeedOrEpochOthers) {
  TokenBatcher a(counting_tokens(5000), 4, 16, "a"), b(counting_tokens(5000), 4, 16, "b");
  EXPECT_TRUE(at::equal(a.batch(0, 2, 7).input_ids, b.batch(0, 2, 7).input_ids));
  EXPECT_TRUE(at::equal(a.batch(1, 0, 7).input_ids, b.batch(1, 0, 7).input_ids));
  EXPECT_FALSE(at::equal(a.batch(0, 2, 7).input_ids, a.batch(0, 2, 8).input_ids));
  EXPECT_FALSE(at::equal(a.batch(0, 2, 7).input_ids, a.batch(1, 2, 7).input_ids));
  // A run's later epoch is not another seed's earlier one (seed + epoch made 7/1 replay 8/0).
  EXPECT_FALSE(at::equal(a.batch(1, 2, 7).input_ids, b.batch(0, 2, 8).input_ids));
}

TEST(TokenBatcher, EpochVisitsEverySampleOnce) {
  TokenBatcher batcher(counting_tokens(16 * 12 + 1), 3, 16, "test");
  ASSERT_EQ(batcher.num_batches(), 4);
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < batcher.num_batches(); ++i) {
    const at::Tensor first = batcher.batch(5, i, 1).input_ids.select(1, 0);
    for (int64_t b = 0; b < first.size(0); ++b) starts.push_back(first[b].item<int64_t>());
  }
  std::sort(starts.begin(), starts.end());
  for (size_t i = 0; i < starts.size(); ++i) EXPECT_EQ(starts[i], static_cast<int64_t>(i) * 16);
}

TEST(TokenBatcher, TooLittleDataAndBadIndexAreErrors) {
  try {
    TokenBatcher batcher(counting_tokens(40), 4, 16, "tiny.txt");
    FAIL() << "40 tokens cannot fill a 4 x 16 batch";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny.txt"), std::string::npos) << e.what();
  }
  TokenBatcher batcher(counting_tokens(100), 2, 16, "test");
  EXPECT_THROW(batcher.batch(0, batcher.num_batches(), 1), std::out_of_range);
  EXPECT_THROW(batcher.batch(0, -1, 1), std::out_of_range);
}

// The stream is kept in blocks of TokenStream::kBlockTokens: a sample across a block boundary
// reads both blocks, and the stream's CRC is that of the tokens laid end to end.
TEST(TokenStream, SamplesAndTheCrcSpanBlockBoundaries) {
  const auto n = static_cast<int32_t>(TokenStream::kBlockTokens + 1000);
  const std::vector<int32_t> flat = counting_tokens(n);
  TokenStream stream;
  for (int32_t t : flat) stream.push_back(t);
  ASSERT_EQ(stream.size(), n);
  EXPECT_EQ(stream[TokenStream::kBlockTokens - 1], TokenStream::kBlockTokens - 1);
  EXPECT_EQ(stream[TokenStream::kBlockTokens], TokenStream::kBlockTokens);
  EXPECT_EQ(stream.to_vector(), flat);
  // Moved from, a stream is empty and usable again.
  TokenStream moved = std::move(stream);
  EXPECT_EQ(moved.size(), n);
  EXPECT_EQ(stream.size(), 0);  // NOLINT(bugprone-use-after-move): what a moved-from stream is
  stream.push_back(7);
  EXPECT_EQ(stream[0], 7);
  stream = std::move(moved);
  ASSERT_EQ(stream.size(), n);
  // A sequence length that does not divide the block: some sample straddles the boundary.
  constexpr int64_t kSeq = 1000;
  TokenBatcher batcher(std::move(stream), 1, kSeq, "blocks");
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(flat.data()), static_cast<uInt>(flat.size() * sizeof(int32_t)));
  EXPECT_EQ(batcher.tokens_crc32(), static_cast<uint32_t>(crc));
  const int64_t straddling = TokenStream::kBlockTokens / kSeq;  // starts before the boundary, ends after it
  ASSERT_LT(straddling * kSeq, TokenStream::kBlockTokens);
  ASSERT_GT((straddling + 1) * kSeq, TokenStream::kBlockTokens);
  bool found = false;
  for (int64_t i = 0; i < batcher.num_batches() && !found; ++i) {
    const Batch b = batcher.batch(0, i, 1);
    if (b.input_ids[0][0].item<int64_t>() != straddling * kSeq) continue;
    found = true;
    EXPECT_TRUE(at::equal(b.input_ids[0], at::arange(straddling * kSeq, (straddling + 1) * kSeq, at::kLong)));
    EXPECT_TRUE(at::equal(b.targets, b.input_ids + 1));
  }
  EXPECT_TRUE(found) << "no batch held the straddling sample";
}

TEST(TokenizeDocuments, JoinsDocumentsWithEndOfText) {
  ByteTokenizer tokenizer;
  const auto tokens = tokenize_documents({{"a", "hi"}, {"b", "yo"}}, tokenizer);
  EXPECT_EQ(tokens, (std::vector<int32_t>{'h', 'i', 256, 'y', 'o', 256}));
}

TEST(TextDatasets, CodeSearchNetFallsBackToTheEmbeddedCorpus) {
  auto dataset = dataset_registry().create("code_search_net");
  DatasetConfig config;
  config.batch_size = 4;
  ModelConfig model;
  model.sequence_length = 64;
  dataset->set_seed(3);
  dataset->load_dataset(config, model);
  EXPECT_EQ(dataset->get_tokenizer().vocab_size(), 257);
  ASSERT_GT(dataset->num_batches(), 10);
  const Batch first = dataset->process_batch(0, 1);
  EXPECT_EQ(first.input_ids.sizes(), (std::vector<int64_t>{4, 64}));
  EXPECT_LT(first.input_ids.max().item<int64_t>(), 257);
  // Another instance with the same seed serves the same batch.
  auto again = dataset_registry().create("code_search_net");
  again->set_seed(3);
  again->load_dataset(config, model);
  EXPECT_TRUE(at::equal(first.input_ids, again->process_batch(0, 1).input_ids));
}

// dataset.name text on `path`, two samples a batch.
DatasetConfig text_config(const std::string& path) {
  DatasetConfig config;
  config.name = "text";
  config.path = path;
  config.batch_size = 2;
  return config;
}

TEST(TextDatasets, TextFileAndVocabularyCheck) {
  gpipe::testing::TempDir temp;
  const std::filesystem::path path = temp.path() + "/small.txt";
  {
    std::ofstream out(path);
    for (int i = 0; i < 100; ++i) out << "line " << i << " of a small text file\n";
  }
  DatasetConfig config = text_config(path.string());
  ModelConfig model;
  model.sequence_length = 32;
  auto dataset = dataset_registry().create("text");
  dataset->load_dataset(config, model);
  const Batch batch = dataset->process_batch(0, 0);
  const auto& tokenizer = dataset->get_tokenizer();
  std::vector<int64_t> row(batch.input_ids[0].data_ptr<int64_t>(), batch.input_ids[0].data_ptr<int64_t>() + 32);
  EXPECT_NE(tokenizer.decode(row).find("small text"), std::string::npos) << tokenizer.decode(row);
  model.vocab_size = 100;  // smaller than the byte vocabulary
  EXPECT_THROW(dataset->load_dataset(config, model), std::runtime_error);
}

// The datasets read and tokenize one document at a time: the stream they build is the one the
// readers' documents give, in the readers' order (a folder's files sorted by path).
TEST(TextDatasets, AFolderStreamedDocumentByDocumentGivesTheReadersTokens) {
  gpipe::testing::TempDir temp;
  const std::filesystem::path dir = temp.path() + "/corpus";
  std::filesystem::create_directories(dir / "sub");
  for (const char* name : {"b.txt", "a.txt", "sub/c.txt"}) {
    std::ofstream out(dir / name);
    for (int i = 0; i < 40; ++i) out << name << " line " << i << "\n";
  }
  ModelConfig model;
  model.sequence_length = 32;
  auto dataset = dataset_registry().create("text");
  dataset->load_dataset(text_config(dir.string()), model);
  ByteTokenizer tokenizer;
  const TokenBatcher expected(tokenize_documents(read_text_path(dir.string()), tokenizer), 2, 32, "expected");
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", expected.tokens_crc32());
  EXPECT_EQ(dataset->content_digest(), std::to_string(expected.num_tokens()) + " tokens, " +
                                           std::to_string(expected.num_batches()) + " batches per epoch, token CRC-32 " + crc);
}

}  // namespace
}  // namespace gpipe::test
