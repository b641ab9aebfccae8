// Tokenizers behind gpipe::Tokenizer (interfaces.h).
//   ByteTokenizer          ids 0..255 are the UTF-8 bytes of the text, id 256 is <|endoftext|>
//                          (EOT, put between documents); vocab_size() == 257.
//   SentencePieceTokenizer a trained SentencePiece .model (spm_train); EOT is the model's </s>
//                          (eos_id) when it has one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/data/token_stream.h"
#include "trainer/model/interfaces.h"

namespace gpipe {

// A tokenizer plus the id the data pipeline puts between documents (absent: documents are
// simply concatenated).
class DocumentTokenizer : public Tokenizer {
 public:
  virtual std::optional<int64_t> eot_id() const = 0;
  // Appends the text's tokens to `out` (ids fit int32: the caller checks vocab_size()). The
  // tokenizers override it to skip encode()'s int64 vector, 8 bytes a token for the whole text:
  // a plain-text file is one document, so that was 8 bytes per byte of the file at once.
  virtual void encode_into(const std::string& text, TokenStream& out) const {
    for (int64_t id : encode(text)) out.push_back(static_cast<int32_t>(id));
  }
};

class ByteTokenizer final : public DocumentTokenizer {
 public:
  static constexpr int64_t kEndOfText = 256;
  static constexpr const char* kEndOfTextText = "<|endoftext|>";

  int64_t vocab_size() const override { return 257; }
  std::vector<int64_t> encode(const std::string& text) const override;
  void encode_into(const std::string& text, TokenStream& out) const override;
  // EOT decodes to "<|endoftext|>"; an id outside [0, 257) throws std::out_of_range.
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::optional<int64_t> eot_id() const override { return kEndOfText; }
};

class SentencePieceTokenizer final : public DocumentTokenizer {
 public:
  // Throws std::runtime_error naming `model_path` when it is missing or not a SentencePiece model
  // (or when this build has no SentencePiece).
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  int64_t vocab_size() const override;
  std::vector<int64_t> encode(const std::string& text) const override;
  void encode_into(const std::string& text, TokenStream& out) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::optional<int64_t> eot_id() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// dataset.tokenizer: "byte" or "sentencepiece" (which needs dataset.tokenizer_model). Anything
// else throws std::invalid_argument naming the value and the choices.
std::unique_ptr<DocumentTokenizer> make_tokenizer(const DatasetConfig& dataset);

}  // namespace gpipe
