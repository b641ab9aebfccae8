// Readers: CodeSearchNet JSONL and JSONL.gz written here, plain text files and folders, the
// embedded corpus, and errors that name the file and line.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "temp_dir.h"
#include "trainer/data/text_data.h"

namespace gpipe::test {
namespace {

namespace fs = std::filesystem;

class DataFiles : public ::testing::Test {
 protected:
  gpipe::testing::TempDir temp_;
  fs::path dir_{temp_.path()};

  static std::string record(const std::string& func, const std::string& docstring, const std::string& code) {
    nlohmann::json j = {{"repo", "octo/demo"}, {"path", "demo.py"}, {"func_name", func},
                        {"original_string", docstring + code}, {"language", "python"}, {"code", code},
                        {"code_tokens", nlohmann::json::array({"def", func})}, {"docstring", docstring},
                        {"docstring_tokens", nlohmann::json::array()}, {"sha", "abc"},
                        {"url", "https://example.com"}, {"partition", "train"}};
    return j.dump();
  }
  std::string write(const std::string& name, const std::string& content) const {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << content;
    return path.string();
  }
  std::string write_gz(const std::string& name, const std::string& content) const {
    const std::string path = (dir_ / name).string();
    fs::create_directories((dir_ / name).parent_path());
    gzFile file = gzopen(path.c_str(), "wb");
    EXPECT_NE(file, nullptr);
    EXPECT_EQ(gzwrite(file, content.data(), static_cast<unsigned>(content.size())), static_cast<int>(content.size()));
    gzclose(file);
    return path;
  }
};

TEST_F(DataFiles, CodeSearchNetJsonlGivesDocstringPlusCode) {
  const std::string path = write("a.jsonl", record("f", "Adds.", "def f(a, b):\n    return a + b") + "\n\n" +
                                                record("g", "", "def g():\n    pass") + "\n");
  const auto docs = read_codesearchnet(path);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].text, "Adds.\ndef f(a, b):\n    return a + b");
  EXPECT_EQ(docs[1].text, "def g():\n    pass");
  EXPECT_EQ(docs[1].source, path + ":3");
}

TEST_F(DataFiles, CodeSearchNetGzipAndFolderInSortedOrder) {
  write_gz("train/python_train_1.jsonl.gz", record("second", "Two.", "def second(): pass") + "\n");
  write_gz("train/python_train_0.jsonl.gz", record("first", "One.", "def first(): pass"));  // no final newline
  write("train/notes.txt", "not data");
  const auto docs = read_codesearchnet((dir_ / "train").string());
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].text, "One.\ndef first(): pass");
  EXPECT_EQ(docs[1].text, "Two.\ndef second(): pass");
}

TEST_F(DataFiles, CodeSearchNetErrorsNameFileAndLine) {
  const std::string bad_json = write("bad.jsonl", record("f", "d", "c") + "\n{\"code\": \n");
  try {
    read_codesearchnet(bad_json);
    FAIL() << "invalid JSON must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(bad_json + ":2"), std::string::npos) << e.what();
  }
  const std::string no_code = write("nocode.jsonl", "{\"docstring\": \"only docs\"}\n");
  try {
    read_codesearchnet(no_code);
    FAIL() << "a record without code must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(no_code + ":1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"code\""), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_codesearchnet((dir_ / "missing.jsonl").string()), std::runtime_error);
  fs::create_directories(dir_ / "empty");
  EXPECT_THROW(read_codesearchnet((dir_ / "empty").string()), std::runtime_error);
}

TEST_F(DataFiles, TruncatedGzipIsAnError) {
  std::string body;
  for (int i = 0; i < 200; ++i) body += record("f" + std::to_string(i), "doc", "def f(): return " + std::to_string(i)) + "\n";
  const std::string path = write_gz("whole.jsonl.gz", body);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string truncated = write("cut.jsonl.gz", bytes.substr(0, bytes.size() / 2));
  try {
    read_codesearchnet(truncated);
    FAIL() << "a truncated gzip file must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(truncated), std::string::npos) << e.what();
  }
}

// Cut on a flush boundary, a gzip reads to a clean end of data: every line read looked whole, and
// the truncated file trained as if it were the dataset (zlib says so only at the end: Z_BUF_ERROR).
TEST_F(DataFiles, AGzipCutWhereItWasFlushedIsAnError) {
  const std::string whole = (dir_ / "flushed.jsonl.gz").string();
  gzFile file = gzopen(whole.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  std::streamoff cut = 0;
  for (int i = 0; i < 400; ++i) {
    const std::string line = record("f" + std::to_string(i), "doc", "def f(): return " + std::to_string(i)) + "\n";
    ASSERT_EQ(gzwrite(file, line.data(), static_cast<unsigned>(line.size())), static_cast<int>(line.size()));
    ASSERT_EQ(gzflush(file, Z_SYNC_FLUSH), Z_OK);
    if (i == 199) cut = static_cast<std::streamoff>(gzoffset(file));  // bytes written after 200 records
  }
  gzclose(file);
  std::ifstream in(whole, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(cut, 0);
  const std::string truncated = write("flushed_cut.jsonl.gz", bytes.substr(0, static_cast<size_t>(cut)));
  try {
    const auto docs = read_codesearchnet(truncated);
    FAIL() << "a gzip cut on a flush boundary read as " << docs.size() << " documents";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("ends early"), std::string::npos) << e.what();
  }
}

TEST_F(DataFiles, TextFolderIsSortedAndSkipsHiddenFiles) {
  write("b.txt", "second");
  write("a/z.md", "first");
  write(".hidden", "never");
  write(".git/config", "never");
  const auto docs = read_text_path(dir_.string());
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].text, "first");
  EXPECT_EQ(docs[1].text, "second");
  EXPECT_EQ(read_text_path((dir_ / "b.txt").string()).at(0).text, "second");
  try {
    read_text_path((dir_ / "nope").string());
    FAIL() << "a missing path must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
}

// A path that cannot seek (a FIFO, /dev/stdin, bash's <(zcat ...)) is read too.
TEST_F(DataFiles, ATextPathThatCannotSeekIsReadWhole) {
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::thread writer([&fifo] {
    std::ofstream out(fifo);  // blocks until the reader opens it
    for (int i = 0; i < 1000; ++i) out << "line " << i << " from a pipe\n";
  });
  std::vector<TextDocument> docs;
  try {
    docs = read_text_path(fifo.string());
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  writer.join();
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].text.rfind("line 0 from a pipe\n", 0), 0u);
  EXPECT_NE(docs[0].text.find("line 999 from a pipe\n"), std::string::npos) << docs[0].text.size() << " bytes read";
}

TEST(EmbeddedCorpus, HoldsTheProjectSourcesInSortedOrder) {
  const auto docs = embedded_corpus();
  ASSERT_GT(docs.size(), 10u);
  bool found_header = false;
  size_t bytes = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    bytes += docs[i].text.size();
    if (i > 0) {
      EXPECT_LT(docs[i - 1].source, docs[i].source);
    }
    if (docs[i].source == "embedded:trainer/data/include/trainer/data/text_data.h") {
      found_header = true;
      EXPECT_NE(docs[i].text.find("class TokenBatcher"), std::string::npos);
    }
  }
  EXPECT_TRUE(found_header);
  EXPECT_GT(bytes, 50'000u);
}

}  // namespace
}  // namespace gpipe::test
