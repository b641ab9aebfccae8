// TensorBoardEventWriter: tensorboard.Event messages (protobuf) in TFRecord frames.
#include "trainer/tensorboard/event_writer.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "trainer/launch/world.h"

#ifndef OURGPIPE_TENSORBOARD_UNAVAILABLE
#include <boost/crc.hpp>

// Where protoc writes the header depends on CMake's protobuf_generate (3.2x writes proto/..., the
// GPU image's CMake writes it flat): take whichever this build generated.
#if __has_include("proto/tensorboard_event.pb.h")
#include "proto/tensorboard_event.pb.h"
#else
#include "tensorboard_event.pb.h"
#endif
#endif

namespace gpipe {
#ifndef OURGPIPE_TENSORBOARD_UNAVAILABLE
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

const char* TensorBoardEventWriter::unavailable_reason() { return nullptr; }

uint32_t tfrecord_masked_crc32c(const void* data, size_t size) {
  // CRC-32C: polynomial 0x1EDC6F41, reflected in and out, initial and final XOR all ones.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  const uint32_t value = crc.checksum();
  return ((value >> 15) | (value << 17)) + 0xa282ead8u;
}

TensorBoardEventWriter::TensorBoardEventWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  const auto now = static_cast<int64_t>(wall_seconds());
  path_ = (std::filesystem::path(log_dir) / fmt::format("events.out.tfevents.{}.{}.{}", now, this_host_name(), getpid()))
              .string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) {
    throw std::runtime_error("cannot write TensorBoard events to '" + path_ +
                             "': set training.output_dir to a writable folder");
  }
  tensorboard::Event version;
  version.set_wall_time(wall_seconds());
  version.set_file_version("brain.Event:2");
  write_record(version.SerializeAsString());
}

void TensorBoardEventWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  tensorboard::Event event;
  event.set_wall_time(wall_seconds());
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    tensorboard::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void TensorBoardEventWriter::write_record(const std::string& bytes) {
  // TFRecord frame; both integers little-endian (x86-64 and aarch64 hosts are).
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "TFRecord frames are little-endian");
  const uint64_t length = bytes.size();
  const uint32_t length_crc = tfrecord_masked_crc32c(&length, sizeof(length));
  const uint32_t data_crc = tfrecord_masked_crc32c(bytes.data(), bytes.size());
  out_.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out_.write(reinterpret_cast<const char*>(&length_crc), sizeof(length_crc));
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), sizeof(data_crc));
  out_.flush();
  if (!out_) throw std::runtime_error("writing TensorBoard events to '" + path_ + "' failed (disk full?)");
}

#else  // OURGPIPE_TENSORBOARD_UNAVAILABLE
const char* TensorBoardEventWriter::unavailable_reason() {
  return "this gpipe_runner was built without protobuf or Boost's headers, so it writes no TensorBoard "
         "scalars (metrics.jsonl has the same values): install libprotobuf-dev, protobuf-compiler and "
         "libboost-dev (scripts/install-deps.sh) and rebuild";
}

TensorBoardEventWriter::TensorBoardEventWriter(const std::string&) { throw std::runtime_error(unavailable_reason()); }
// Unreachable: no writer can be constructed in this build.
void TensorBoardEventWriter::add_scalars(int64_t, const std::vector<std::pair<std::string, double>>&) {
  throw std::logic_error(unavailable_reason());
}
void TensorBoardEventWriter::write_record(const std::string&) { throw std::logic_error(unavailable_reason()); }
uint32_t tfrecord_masked_crc32c(const void*, size_t) { throw std::runtime_error(TensorBoardEventWriter::unavailable_reason()); }

#endif  // OURGPIPE_TENSORBOARD_UNAVAILABLE

}  // namespace gpipe
