// TensorBoardEventWriter's framing (TFRecord) and checksum. What TensorBoard makes of the events
// is checked with TensorBoard's own reader by tensorboard_events_test.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "trainer/tensorboard/event_writer.h"

namespace gpipe {
namespace {

// Expected values from TensorBoard's own masked_crc32c
// (tensorboard.compat.tensorflow_stub.pywrap_tensorflow), not from this code.
TEST(TensorBoardWriter, MaskedCrc32cMatchesTensorBoards) {
  EXPECT_EQ(tfrecord_masked_crc32c("123456789", 9), 0xc78ab0e5u);
  EXPECT_EQ(tfrecord_masked_crc32c("", 0), 0xa282ead8u);
  const uint64_t zero = 0;
  EXPECT_EQ(tfrecord_masked_crc32c(&zero, sizeof zero), 0x07980329u);
}

struct Frame {
  uint64_t length;
  std::string data;
};

std::vector<Frame> read_frames(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Frame> frames;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_GE(bytes.size() - at, 12u) << "truncated header at byte " << at;
    uint64_t length = 0;
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(length_crc, tfrecord_masked_crc32c(bytes.data() + at, 8)) << "header CRC at byte " << at;
    EXPECT_GE(bytes.size() - at - 12, length + 4) << "truncated record at byte " << at;
    if (bytes.size() - at - 12 < length + 4) break;
    std::string data = bytes.substr(at + 12, length);
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    EXPECT_EQ(data_crc, tfrecord_masked_crc32c(data.data(), data.size())) << "data CRC at byte " << at;
    frames.push_back({length, std::move(data)});
    at += 12 + length + 4;
  }
  return frames;
}

TEST(TensorBoardWriter, WritesTheVersionEventThenOneFramedEventPerStepAtOnce) {
  const auto dir = std::filesystem::temp_directory_path() / ("tb_writer_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string path;
  {
    TensorBoardEventWriter writer(dir.string());
    path = writer.path();
    EXPECT_EQ(std::filesystem::path(path).parent_path(), dir);
    EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
    writer.add_scalars(0, {{"train/loss", 5.5}, {"train/learning_rate", 1e-3}});
    // Flushed per event: a TensorBoard reading while the run goes on sees it already.
    const auto frames = read_frames(path);
    ASSERT_EQ(frames.size(), 2u);
    EXPECT_NE(frames[0].data.find("brain.Event:2"), std::string::npos);
    EXPECT_NE(frames[1].data.find("train/loss"), std::string::npos);
    EXPECT_NE(frames[1].data.find("train/learning_rate"), std::string::npos);
    writer.add_scalars(1, {{"train/loss", 5.25}});
  }
  EXPECT_EQ(read_frames(path).size(), 3u);
  std::filesystem::remove_all(dir);
}

TEST(TensorBoardWriter, AnUnwritableFolderIsAnErrorNamingIt) {
  try {
    TensorBoardEventWriter writer("/proc/no/such/folder");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/no/such/folder"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gpipe
