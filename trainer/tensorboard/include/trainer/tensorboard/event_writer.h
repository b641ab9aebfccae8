// TensorBoard event files: scalars a run writes live, which `tensorboard --logdir <output>` shows
// next to the PyTorch profiler traces of the same folder.
//
// The file is TensorBoard's own format: `events.out.tfevents.<seconds>.<host>.<pid>` holding
// TFRecord frames (little-endian u64 length, masked CRC-32C of the length, the serialized
// tensorboard.Event, masked CRC-32C of it). Events are protobuf messages generated from
// proto/tensorboard_event.proto; the CRC is Boost.CRC's. This header names neither, so LibTorch
// code (whose include folder carries a protobuf of its own) can include it.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace gpipe {

class TensorBoardEventWriter {
 public:
  // nullptr when this build writes event files; otherwise why not (built without protobuf or
  // Boost) and what to do. The constructor throws that text when it is not null.
  static const char* unavailable_reason();

  // Creates `<log_dir>` and the event file in it, and writes the file-version event TensorBoard
  // expects first. Throws std::runtime_error naming the file when it cannot be written.
  explicit TensorBoardEventWriter(const std::string& log_dir);

  // One event at `step` holding every (tag, value) pair as a scalar (TensorBoard stores them as
  // float32), flushed at once so a running TensorBoard sees it.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& bytes);

  std::string path_;
  std::ofstream out_;
};

// TFRecord's masked CRC-32C (Castagnoli) of `size` bytes: rotate right by 15, add 0xa282ead8.
uint32_t tfrecord_masked_crc32c(const void* data, size_t size);

}  // namespace gpipe
