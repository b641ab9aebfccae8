// The BERT datasets (bert_masking.h), registered here so the linker keeps the registrations
// (models_all is linked whole):
//   "bert_code_search_net" (also "bert")  CodeSearchNet JSONL / JSONL.gz (dataset.path), masked
//   "bert_text"                            plain text files or folders (dataset.path), masked
// All use the embedded corpus when dataset.path is empty.
#include "bert_masking.h"
#include "trainer/model/registry.h"

namespace gpipe::bert {

class CodeSearchNetMlmDataset final : public MaskedLmDataset {
 public:
  CodeSearchNetMlmDataset() : MaskedLmDataset(TextDataset::Format::kCodeSearchNet) {}
};

class PlainTextMlmDataset final : public MaskedLmDataset {
 public:
  PlainTextMlmDataset() : MaskedLmDataset(TextDataset::Format::kPlainText) {}
};

GPIPE_REGISTER_DATASET("bert_code_search_net", CodeSearchNetMlmDataset);
GPIPE_REGISTER_DATASET("bert_text", PlainTextMlmDataset);
// "bert": the same as bert_code_search_net (the default source, as code_search_net is the GPT's).
static const bool gpipe_registered_dataset_bert = ::gpipe::dataset_registry().add(
    "bert", [] { return std::make_unique<CodeSearchNetMlmDataset>(); });

}  // namespace gpipe::bert
