// CodeSearchNet JSONL / JSONL.gz reader. zlib's gzread reads gzip and plain files alike, so one
// line splitter serves both; errors name the file and the 1-based line.
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "trainer/data/text_data.h"

namespace gpipe {
namespace {

namespace fs = std::filesystem;

bool is_codesearchnet_file(const fs::path& p) {
  const std::string name = p.filename().string();
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".jsonl") || ends_with(".jsonl.gz");
}

// Calls on_line(line_number, line) for every line of `path` (gzip or plain).
void for_each_line(const std::string& path, const std::function<void(int64_t, const std::string&)>& on_line) {
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  if (!file) throw std::runtime_error("cannot open CodeSearchNet file '" + path + "'");
  std::string pending;
  int64_t line_number = 0;
  std::vector<char> chunk(1 << 16);
  for (;;) {
    const int n = gzread(file.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      const char* message = gzerror(file.get(), &code);
      throw std::runtime_error("cannot read CodeSearchNet file '" + path + "' after line " +
                               std::to_string(line_number) + ": " + (message ? message : "zlib error") +
                               " (truncated or corrupt gzip?)");
    }
    if (n == 0) {
      // A gzip cut on a flush boundary reads to a clean end of data: zlib says only here that
      // the member never ended (Z_BUF_ERROR), and its lines so far looked whole.
      int code = Z_OK;
      gzerror(file.get(), &code);
      if (code == Z_BUF_ERROR) {
        throw std::runtime_error("cannot read CodeSearchNet file '" + path + "' after line " +
                                 std::to_string(line_number) + ": the gzip stream ends early (truncated file?)");
      }
      break;
    }
    size_t start = 0;
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      if (chunk[i] != '\n') continue;
      pending.append(chunk.data() + start, i - start);
      on_line(++line_number, pending);
      pending.clear();
      start = i + 1;
    }
    pending.append(chunk.data() + start, static_cast<size_t>(n) - start);
  }
  if (!pending.empty()) on_line(++line_number, pending);
}

std::string string_field(const nlohmann::json& record, const char* field, const std::string& where, bool required) {
  auto it = record.find(field);
  if (it == record.end() || it->is_null()) {
    if (!required) return {};
    throw std::runtime_error(where + ": CodeSearchNet record has no \"" + field + "\" field");
  }
  if (!it->is_string()) throw std::runtime_error(where + ": CodeSearchNet field \"" + field + "\" is not a string");
  return it->get<std::string>();
}

// Returns how many documents it handed to `visit`.
int64_t read_file(const std::string& path, const DocumentVisitor& visit) {
  int64_t count = 0;
  for_each_line(path, [&](int64_t line_number, const std::string& line) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) return;  // blank line
    const std::string where = path + ":" + std::to_string(line_number);
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw std::runtime_error(where + ": not valid JSON (" + e.what() + "); expected one CodeSearchNet object per line");
    }
    if (!record.is_object()) throw std::runtime_error(where + ": expected a JSON object per line");
    const std::string docstring = string_field(record, "docstring", where, false);
    const std::string code = string_field(record, "code", where, true);
    visit({where, docstring.empty() ? code : docstring + "\n" + code});
    ++count;
  });
  return count;
}

}  // namespace

void for_each_codesearchnet_document(const std::string& path, const DocumentVisitor& visit) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw std::runtime_error("CodeSearchNet path '" + path + "' does not exist (dataset.path: a .jsonl/.jsonl.gz file or a folder)");
  }
  std::vector<std::string> files;
  if (fs::is_directory(status)) {
    for (const auto& entry : fs::recursive_directory_iterator(path)) {
      if (entry.is_regular_file() && is_codesearchnet_file(entry.path())) files.push_back(entry.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) throw std::runtime_error("CodeSearchNet folder '" + path + "' has no *.jsonl or *.jsonl.gz files");
  } else {
    files.push_back(path);
  }
  int64_t documents = 0;
  for (const auto& file : files) documents += read_file(file, visit);
  if (documents == 0) throw std::runtime_error("CodeSearchNet path '" + path + "' holds no records");
}

std::vector<TextDocument> read_codesearchnet(const std::string& path) {
  std::vector<TextDocument> documents;
  for_each_codesearchnet_document(path, [&documents](TextDocument&& d) { documents.push_back(std::move(d)); });
  return documents;
}

}  // namespace gpipe
