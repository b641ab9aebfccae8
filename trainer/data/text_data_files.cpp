// Plain-text reader: a file is one document, a folder is its files in sorted path order.
// (lexically_relative, not fs::relative: libtorch.so exports its own, unreliable, copies of some
// std::filesystem functions, which win symbol lookup in programs linked with LibTorch.)
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "trainer/data/text_data.h"

namespace gpipe {
namespace {

namespace fs = std::filesystem;

bool is_hidden(const fs::path& relative) {
  for (const auto& part : relative) {
    const std::string name = part.string();
    if (!name.empty() && name[0] == '.' && name != "." && name != "..") return true;
  }
  return false;
}

// Read straight into a string of the file's size (a stringstream held the text twice); a stream
// that cannot seek (a FIFO, /dev/stdin, a process substitution) is read through one.
std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open text file '" + path + "'");
  const std::streamoff size = in.seekg(0, std::ios::end) ? static_cast<std::streamoff>(in.tellg()) : -1;
  if (size < 0) {
    in.clear();
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) throw std::runtime_error("cannot read text file '" + path + "'");
    return text.str();
  }
  std::string text(static_cast<size_t>(size), '\0');
  if (!in.seekg(0) || !in.read(text.data(), size)) throw std::runtime_error("cannot read text file '" + path + "'");
  return text;
}

}  // namespace

void for_each_text_document(const std::string& path, const DocumentVisitor& visit) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw std::runtime_error("text path '" + path + "' does not exist (dataset.path: a text file or a folder)");
  }
  if (!fs::is_directory(status)) {
    visit({path, read_whole_file(path)});
    return;
  }

  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_regular_file() && !is_hidden(entry.path().lexically_relative(path))) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw std::runtime_error("text folder '" + path + "' has no files");
  for (const auto& file : files) visit({file, read_whole_file(file)});
}

std::vector<TextDocument> read_text_path(const std::string& path) {
  std::vector<TextDocument> documents;
  for_each_text_document(path, [&documents](TextDocument&& d) { documents.push_back(std::move(d)); });
  return documents;
}

}  // namespace gpipe
