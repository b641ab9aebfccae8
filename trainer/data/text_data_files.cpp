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

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open text file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read text file '" + path + "'");
  return text.str();
}

}  // namespace

std::vector<TextDocument> read_text_path(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw std::runtime_error("text path '" + path + "' does not exist (dataset.path: a text file or a folder)");
  }
  if (!fs::is_directory(status)) return {{path, read_whole_file(path)}};

  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(path)) {
    if (entry.is_regular_file() && !is_hidden(entry.path().lexically_relative(path))) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) throw std::runtime_error("text folder '" + path + "' has no files");
  std::vector<TextDocument> documents;
  documents.reserve(files.size());
  for (const auto& file : files) documents.push_back({file, read_whole_file(file)});
  return documents;
}

}  // namespace gpipe
