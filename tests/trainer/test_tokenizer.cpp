// Tokenizers: byte round-trip and specials, SentencePiece trained on the fly, factory errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "temp_dir.h"
#include "trainer/data/tokenizer.h"

#ifdef OURGPIPE_HAVE_SENTENCEPIECE
#include <sentencepiece_trainer.h>
#endif

namespace gpipe::test {
namespace {

namespace fs = std::filesystem;

TEST(ByteTokenizer, RoundTripsAnyBytes) {
  ByteTokenizer tokenizer;
  std::string text = "def f(x):\n    return x  # ünïcödé ✓\t";
  text.push_back('\0');
  text.push_back('\xff');
  const auto ids = tokenizer.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  for (int64_t id : ids) EXPECT_TRUE(id >= 0 && id < 256);
  EXPECT_EQ(tokenizer.decode(ids), text);
  EXPECT_EQ(tokenizer.vocab_size(), 257);
  // The data pipeline's path (straight into the token stream) gives the same ids.
  TokenStream stream;
  tokenizer.encode_into(text, stream);
  EXPECT_EQ(stream.to_vector(), std::vector<int32_t>(ids.begin(), ids.end()));
}

TEST(ByteTokenizer, EndOfTextAndBadIds) {
  ByteTokenizer tokenizer;
  ASSERT_TRUE(tokenizer.eot_id().has_value());
  EXPECT_EQ(*tokenizer.eot_id(), 256);
  EXPECT_EQ(tokenizer.decode({'a', 256, 'b'}), "a<|endoftext|>b");
  EXPECT_THROW(tokenizer.decode({257}), std::out_of_range);
  EXPECT_THROW(tokenizer.decode({-1}), std::out_of_range);
}

TEST(TokenizerFactory, UnknownNameListsTheChoices) {
  DatasetConfig dataset;
  dataset.tokenizer = "wordpiece";
  try {
    make_tokenizer(dataset);
    FAIL() << "unknown tokenizer must throw";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("wordpiece"), std::string::npos) << what;
    EXPECT_NE(what.find("sentencepiece"), std::string::npos) << what;
  }
  dataset.tokenizer = "byte";
  EXPECT_EQ(make_tokenizer(dataset)->vocab_size(), 257);
}

TEST(SentencePieceTokenizer, MissingOrBadModelFileIsNamed) {
  gpipe::testing::TempDir temp;
  const fs::path dir = temp.path();
  const std::string missing = (dir / "missing.model").string();
  try {
    SentencePieceTokenizer tokenizer(missing);
    FAIL() << "a missing model must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string garbage = (dir / "garbage.model").string();
  std::ofstream(garbage) << "this is not a protobuf";
  try {
    SentencePieceTokenizer tokenizer(garbage);
    FAIL() << "a bad model must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(garbage), std::string::npos) << e.what();
  }
}

TEST(SentencePieceTokenizer, TrainedModelRoundTrips) {
#ifndef OURGPIPE_HAVE_SENTENCEPIECE
  GTEST_SKIP() << "this build has no SentencePiece (libsentencepiece-dev)";
#else
  gpipe::testing::TempDir temp;
  const fs::path dir = temp.path();
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "def add_" << i << "(a, b):\n    return a + b * " << i << "\n";
      corpus << "the pipeline runs forward and backward passes of micro batch " << i << "\n";
    }
  }
  const std::string prefix = (dir / "tiny").string();
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (dir / "corpus.txt").string() + " --model_prefix=" + prefix +
      " --vocab_size=120 --model_type=bpe --character_coverage=1.0 --minloglevel=2");
  ASSERT_TRUE(status.ok()) << status.ToString();
  SentencePieceTokenizer tokenizer(prefix + ".model");
  EXPECT_EQ(tokenizer.vocab_size(), 120);
  ASSERT_TRUE(tokenizer.eot_id().has_value());
  const std::string text = "def add_7(a, b):\n    return a + b * 7";
  const auto ids = tokenizer.encode(text);
  EXPECT_LT(ids.size(), text.size());  // pieces are longer than one character
  TokenStream stream;
  tokenizer.encode_into(text, stream);
  EXPECT_EQ(stream.to_vector(), std::vector<int32_t>(ids.begin(), ids.end()));
  // SentencePiece normalises whitespace runs, so compare without newlines and indentation.
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("return a + b")), "return a + b");
  EXPECT_THROW(tokenizer.decode({120}), std::out_of_range);
#endif
}

}  // namespace
}  // namespace gpipe::test
