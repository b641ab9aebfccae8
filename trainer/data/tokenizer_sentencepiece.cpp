// SentencePiece tokenizer: loads a .model trained with spm_train. Built without SentencePiece,
// the constructor throws so a config asking for it fails with a clear message.
#include <filesystem>
#include <stdexcept>
#include <string>

#include "trainer/data/tokenizer.h"

#ifdef OURGPIPE_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace gpipe {

#ifdef OURGPIPE_HAVE_SENTENCEPIECE

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
  // The text's piece ids (encode and encode_into widen them each their own way).
  std::vector<int> pieces(const std::string& text) const {
    std::vector<int> ids;
    const auto status = processor.Encode(text, &ids);
    if (!status.ok()) throw std::runtime_error("SentencePiece encode failed: " + status.ToString());
    return ids;
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path) : impl_(std::make_unique<Impl>()) {
  if (model_path.empty()) {
    throw std::runtime_error(
        "dataset.tokenizer is 'sentencepiece' but dataset.tokenizer_model is empty: set it to a .model "
        "file trained with spm_train");
  }
  if (!std::filesystem::is_regular_file(model_path)) {
    throw std::runtime_error("SentencePiece model '" + model_path +
                             "' does not exist or is not a file (dataset.tokenizer_model); train one with spm_train");
  }
  const auto status = impl_->processor.Load(model_path);
  if (!status.ok()) {
    throw std::runtime_error("cannot load SentencePiece model '" + model_path + "': " + status.ToString() +
                             " (is it a .model file written by spm_train?)");
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->processor.GetPieceSize(); }

std::vector<int64_t> SentencePieceTokenizer::encode(const std::string& text) const {
  const std::vector<int> pieces = impl_->pieces(text);
  return {pieces.begin(), pieces.end()};
}

void SentencePieceTokenizer::encode_into(const std::string& text, TokenStream& out) const {
  for (int id : impl_->pieces(text)) out.push_back(static_cast<int32_t>(id));
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> pieces;
  pieces.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range("SentencePieceTokenizer::decode: token id " + std::to_string(id) +
                              " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
    }
    pieces.push_back(static_cast<int>(id));
  }
  std::string text;
  const auto status = impl_->processor.Decode(pieces, &text);
  if (!status.ok()) throw std::runtime_error("SentencePiece decode failed: " + status.ToString());
  return text;
}

std::optional<int64_t> SentencePieceTokenizer::eot_id() const {
  const int eos = impl_->processor.eos_id();
  if (eos < 0) return std::nullopt;
  return eos;
}

#else  // no SentencePiece in this build

struct SentencePieceTokenizer::Impl {};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path) {
  throw std::runtime_error("cannot load SentencePiece model '" + model_path +
                           "': this build has no SentencePiece (install libsentencepiece-dev and reconfigure)");
}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;
int64_t SentencePieceTokenizer::vocab_size() const { return 0; }
std::vector<int64_t> SentencePieceTokenizer::encode(const std::string&) const { return {}; }
void SentencePieceTokenizer::encode_into(const std::string&, TokenStream&) const {}
std::string SentencePieceTokenizer::decode(const std::vector<int64_t>&) const { return {}; }
std::optional<int64_t> SentencePieceTokenizer::eot_id() const { return std::nullopt; }

#endif

}  // namespace gpipe
