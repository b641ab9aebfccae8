// TraceWriter: one record per submitted op, written as Chrome-trace / Perfetto JSON
// (open in ui.perfetto.dev or chrome://tracing). One track (tid) per stream, named with the
// stream's class; each op is an "X" event from its device start (or submission, when the backend
// could not time it) to its end, with args {class, kind, queue_delay_us, seq, grid, block,
// completed, timed}. An op the backend did not report by itself (it reports a stream's newest
// finished op, which retires the ones before it) is completed but untimed: a zero-length span at
// its submission with retired_by_seq and done_by_us (it had finished by then). Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/device.h"
#include "scheduler/op.h"

namespace sched {

struct TraceRecord {
  uint64_t seq = 0;
  StreamId stream = 0;
  StreamClass cls = StreamClass::kUnmanaged;
  OpKind kind = OpKind::kKernel;
  std::string name;  // kernel name, or the op kind for non-kernels
  Dim3 grid, block;
  int64_t arrival_ns = 0;
  int64_t submitted_ns = 0;
  int64_t start_ns = -1;  // -1: completion not (yet) known
  int64_t end_ns = -1;
  // Finished no later than this (-1: not known to have finished); for a retired op, the end of the
  // later op of its stream (retired_by_seq) whose completion retired it.
  int64_t done_by_ns = -1;
  uint64_t retired_by_seq = 0;
  int64_t queue_delay_ns() const { return submitted_ns - arrival_ns; }
};

class TraceWriter {
 public:
  // Keeps at most `max_records` (older records are kept, newer ones counted as dropped), so a long
  // run cannot exhaust memory.
  explicit TraceWriter(size_t max_records = 4'000'000);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  void on_submit(const Op& op);
  void on_complete(const Completion& done);

  size_t size() const;
  uint64_t dropped() const;
  std::vector<TraceRecord> records() const;  // in submission order

  // The Chrome-trace JSON document as text.
  std::string to_json() const;
  // Writes to_json() to `path`; returns "" or an error naming the path and the cause.
  std::string flush(const std::string& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sched
