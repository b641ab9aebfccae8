// dataset.tokenizer -> a tokenizer.
#include <stdexcept>

#include "trainer/data/tokenizer.h"

namespace gpipe {

std::unique_ptr<DocumentTokenizer> make_tokenizer(const DatasetConfig& dataset) {
  if (dataset.tokenizer == "byte") return std::make_unique<ByteTokenizer>();
  if (dataset.tokenizer == "sentencepiece") return std::make_unique<SentencePieceTokenizer>(dataset.tokenizer_model);
  throw std::invalid_argument("dataset.tokenizer '" + dataset.tokenizer +
                              "' is not known: use 'byte' or 'sentencepiece' (with dataset.tokenizer_model)");
}

}  // namespace gpipe
