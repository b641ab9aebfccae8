// Byte-level tokenizer: every UTF-8 byte is a token, so any text round-trips exactly and no
// vocabulary file is needed (the default for the embedded corpus).
#include <stdexcept>
#include <string>

#include "trainer/data/tokenizer.h"

namespace gpipe {

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(static_cast<int64_t>(c));
  return ids;
}

void ByteTokenizer::encode_into(const std::string& text, TokenStream& out) const {
  for (unsigned char c : text) out.push_back(static_cast<int32_t>(c));
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids) {
    if (id >= 0 && id < 256) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (id == kEndOfText) {
      text += kEndOfTextText;
    } else {
      throw std::out_of_range("ByteTokenizer::decode: token id " + std::to_string(id) +
                              " is outside the byte vocabulary [0, 257)");
    }
  }
  return text;
}

}  // namespace gpipe
