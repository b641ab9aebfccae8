// The text datasets (trainer/text_data.h), registered here rather than in the static trainer
// library so the linker cannot drop the registration objects (models_all is linked whole).
//   "code_search_net"  CodeSearchNet JSONL / JSONL.gz (dataset.path), the seed's default
//   "text"             plain text files or folders (dataset.path)
// Both use the embedded corpus when dataset.path is empty.
#include "trainer/model/registry.h"
#include "trainer/data/text_data.h"

namespace gpipe::gpt {

class CodeSearchNetDataset final : public TextDataset {
 public:
  CodeSearchNetDataset() : TextDataset(Format::kCodeSearchNet) {}
};

class PlainTextDataset final : public TextDataset {
 public:
  PlainTextDataset() : TextDataset(Format::kPlainText) {}
};

GPIPE_REGISTER_DATASET("code_search_net", CodeSearchNetDataset);
GPIPE_REGISTER_DATASET("text", PlainTextDataset);

}  // namespace gpipe::gpt
