// The default training corpus, compiled in so the main job needs no download: the blob that
// embedded_corpus.cmake writes from the project's sources, pulled into .rodata with the
// assembler's .incbin (no multi-megabyte array literal for the compiler to chew on).
#include <string_view>

#include "trainer/data/text_data.h"

#ifndef OURGPIPE_EMBEDDED_CORPUS_FILE
#error "OURGPIPE_EMBEDDED_CORPUS_FILE (path of the generated corpus blob) must be defined by the build"
#endif

asm(".pushsection .rodata.ourgpipe_embedded_corpus, \"a\"\n"
    ".balign 16\n"
    ".globl ourgpipe_embedded_corpus_begin\n"
    ".hidden ourgpipe_embedded_corpus_begin\n"
    "ourgpipe_embedded_corpus_begin:\n"
    ".incbin \"" OURGPIPE_EMBEDDED_CORPUS_FILE "\"\n"
    ".globl ourgpipe_embedded_corpus_end\n"
    ".hidden ourgpipe_embedded_corpus_end\n"
    "ourgpipe_embedded_corpus_end:\n"
    ".byte 0\n"
    ".popsection\n");

extern "C" const char ourgpipe_embedded_corpus_begin[];
extern "C" const char ourgpipe_embedded_corpus_end[];

namespace gpipe {

std::vector<TextDocument> embedded_corpus() {
  constexpr char kRecordSeparator = '\x1e';
  const std::string_view blob(ourgpipe_embedded_corpus_begin,
                              static_cast<size_t>(ourgpipe_embedded_corpus_end - ourgpipe_embedded_corpus_begin));
  std::vector<TextDocument> documents;
  size_t pos = blob.find(kRecordSeparator);
  while (pos != std::string_view::npos) {
    const size_t next = blob.find(kRecordSeparator, pos + 1);
    const std::string_view record = blob.substr(pos + 1, next == std::string_view::npos ? std::string_view::npos : next - pos - 1);
    const size_t newline = record.find('\n');
    if (newline != std::string_view::npos) {
      documents.push_back({"embedded:" + std::string(record.substr(0, newline)), std::string(record.substr(newline + 1))});
    }
    pos = next;
  }
  return documents;
}

}  // namespace gpipe
