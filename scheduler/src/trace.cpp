#include "scheduler/trace.h"

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace sched {

struct TraceWriter::Impl {
  size_t max_records;
  mutable std::mutex mu;
  std::vector<TraceRecord> records;
  std::unordered_map<uint64_t, size_t> index_by_seq;  // completions find their record
  // Per stream, the seqs of records still open, in submission order: a stream's ops finish in
  // order, so a completion also closes the earlier ones the backend did not report one by one.
  std::unordered_map<StreamId, std::deque<uint64_t>> open_by_stream;
  uint64_t dropped = 0;
};

TraceWriter::TraceWriter(size_t max_records) : impl_(std::make_unique<Impl>()) {
  impl_->max_records = max_records;
}

TraceWriter::~TraceWriter() = default;

void TraceWriter::on_submit(const Op& op) {
  TraceRecord r;
  r.seq = op.seq;
  r.stream = op.stream;
  r.cls = op.cls;
  r.kind = op.kind;
  if (op.kind == OpKind::kKernel || op.kind == OpKind::kGraphLaunch) {
    r.name = op.kernel.name != nullptr ? op.kernel.name : to_string(op.kind);
    r.grid = op.kernel.grid;
    r.block = op.kernel.block;
  } else {
    r.name = to_string(op.kind);
  }
  r.arrival_ns = op.arrival_ns;
  r.submitted_ns = op.submitted_ns;
  std::lock_guard lock(impl_->mu);
  if (impl_->records.size() >= impl_->max_records) {
    ++impl_->dropped;
    return;
  }
  impl_->index_by_seq[r.seq] = impl_->records.size();
  impl_->open_by_stream[r.stream].push_back(r.seq);
  impl_->records.push_back(std::move(r));
}

void TraceWriter::on_complete(const Completion& done) {
  std::lock_guard lock(impl_->mu);
  auto open = impl_->open_by_stream.find(done.stream);
  if (open != impl_->open_by_stream.end()) {
    std::deque<uint64_t>& seqs = open->second;
    while (!seqs.empty() && seqs.front() < done.seq) {
      auto earlier = impl_->index_by_seq.find(seqs.front());
      if (earlier != impl_->index_by_seq.end()) {
        TraceRecord& r = impl_->records[earlier->second];
        r.retired_by_seq = done.seq;
        r.done_by_ns = done.end_ns;
        impl_->index_by_seq.erase(earlier);
      }
      seqs.pop_front();
    }
    if (!seqs.empty() && seqs.front() == done.seq) seqs.pop_front();
    if (seqs.empty()) impl_->open_by_stream.erase(open);
  }
  auto it = impl_->index_by_seq.find(done.seq);
  if (it == impl_->index_by_seq.end()) return;
  TraceRecord& r = impl_->records[it->second];
  r.start_ns = done.start_ns;
  r.end_ns = done.end_ns;
  r.done_by_ns = done.end_ns;
  impl_->index_by_seq.erase(it);
}

size_t TraceWriter::size() const {
  std::lock_guard lock(impl_->mu);
  return impl_->records.size();
}

uint64_t TraceWriter::dropped() const {
  std::lock_guard lock(impl_->mu);
  return impl_->dropped;
}

std::vector<TraceRecord> TraceWriter::records() const {
  std::lock_guard lock(impl_->mu);
  return impl_->records;
}

std::string TraceWriter::to_json() const {
  using nlohmann::json;
  const std::vector<TraceRecord> recs = records();
  // Tracks numbered by first appearance, so the viewer lists streams in the order they started.
  std::map<StreamId, std::pair<int, StreamClass>> tracks;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"pid", 0}, {"name", "process_name"}, {"args", {{"name", "GPU"}}}});
  for (const TraceRecord& r : recs) {
    auto [it, inserted] = tracks.try_emplace(r.stream, static_cast<int>(tracks.size()) + 1, r.cls);
    const int tid = it->second.first;
    if (inserted) {
      char label[64];
      std::snprintf(label, sizeof(label), "stream 0x%llx (%s)",
                    static_cast<unsigned long long>(r.stream), to_string(r.cls));
      events.push_back({{"ph", "M"}, {"pid", 0}, {"tid", tid}, {"name", "thread_name"},
                        {"args", {{"name", label}}}});
    }
    const bool timed = r.start_ns >= 0 && r.end_ns >= r.start_ns;
    const int64_t begin = timed ? r.start_ns : r.submitted_ns;
    json ev = {{"ph", "X"},
               {"pid", 0},
               {"tid", tid},
               {"name", r.name},
               {"cat", to_string(r.kind)},
               {"ts", static_cast<double>(begin) / 1000.0},
               {"dur", timed ? static_cast<double>(r.end_ns - r.start_ns) / 1000.0 : 0.0}};
    ev["args"] = {{"class", to_string(r.cls)},
                  {"kind", to_string(r.kind)},
                  {"queue_delay_us", static_cast<double>(r.queue_delay_ns()) / 1000.0},
                  {"seq", r.seq},
                  {"grid", {r.grid.x, r.grid.y, r.grid.z}},
                  {"block", {r.block.x, r.block.y, r.block.z}},
                  {"completed", r.done_by_ns >= 0},
                  {"timed", timed}};
    if (r.retired_by_seq != 0) {
      ev["args"]["retired_by_seq"] = r.retired_by_seq;
      ev["args"]["done_by_us"] = static_cast<double>(r.done_by_ns) / 1000.0;
    }
    events.push_back(std::move(ev));
  }
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}};
  doc["otherData"] = {{"dropped_records", dropped()}};
  return doc.dump();
}

std::string TraceWriter::flush(const std::string& path) const {
  const std::string text = to_json();
  std::ofstream out(path, std::ios::trunc);
  if (!out) return "cannot open trace file '" + path + "' for writing: " + std::strerror(errno);
  out << text;
  out.flush();
  if (!out) return "error writing trace file '" + path + "': " + std::strerror(errno);
  return "";
}

}  // namespace sched
