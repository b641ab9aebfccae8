// JSONL workload reader (format in scheduler/workload.h). Every error names file, line and field,
// because workloads are hand-edited and a silent default would skew a study.
#include "scheduler/workload.h"

#include <map>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace sched {
namespace {

using nlohmann::json;

const std::set<std::string>& known_fields() {
  static const std::set<std::string> fields = {
      "arrival_us", "stream", "class", "kind",    "name",   "grid",    "block",
      "smem",       "blocks_per_sm",  "block_us", "duration_us", "profile", "bytes",
      "event",      "client", "request", "after_request", "after_us"};
  return fields;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

class LineReader {
 public:
  LineReader(const json& obj, const std::string& source, int line)
      : obj_(obj), source_(source), line_(line) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw WorkloadError(source_ + ":" + std::to_string(line_) + ": field \"" + field + "\": " + what);
  }
  bool has(const char* field) const { return obj_.contains(field); }

  std::string str(const char* field) const {
    const json& v = obj_.at(field);
    if (!v.is_string()) fail(field, "expected a string, got " + v.dump());
    if (v.get<std::string>().empty()) fail(field, "must not be empty");
    return v.get<std::string>();
  }
  // Strings or integers (ids in generated files are often numbers).
  std::string id(const char* field) const {
    const json& v = obj_.at(field);
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    return str(field);
  }
  double number(const char* field, bool positive) const {
    const json& v = obj_.at(field);
    if (!v.is_number()) fail(field, "expected a number, got " + v.dump());
    double d = v.get<double>();
    if (!std::isfinite(d) || d < 0 || (positive && d == 0)) {
      fail(field, std::string("expected a ") + (positive ? "positive" : "non-negative") +
                      " number, got " + v.dump());
    }
    // Every such field is microseconds, kept as int64 nanoseconds: 1e12 us (11.6 days) leaves
    // room for sums of many.
    if (d > 1e12) fail(field, "must be at most 1e12 (microseconds, 11.6 days), got " + v.dump());
    return d;
  }
  uint64_t count(const char* field) const {
    const json& v = obj_.at(field);
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      fail(field, "expected a non-negative integer, got " + v.dump());
    }
    return v.get<uint64_t>();
  }
  // CUDA's limits: a grid of up to 2^31-1 x 65535 x 65535 blocks, a block of up to 1024 x 1024 x
  // 64 threads and 1024 in all.
  Dim3 dim3(const char* field, bool block) const {
    const json& v = obj_.at(field);
    int axis = 0;
    auto component = [&](const json& c) -> uint32_t {
      const int64_t limit = block ? (axis == 2 ? 64 : 1024) : (axis == 0 ? 0x7fffffff : 65535);
      ++axis;
      if (!c.is_number_integer() || c.get<int64_t>() < 1 || c.get<int64_t>() > limit) {
        fail(field, std::string("expected positive integers (an int or [x, y, z]) within CUDA's ") +
                        (block ? "block limits (1024, 1024, 64)" : "grid limits (2^31-1, 65535, 65535)") + ", got " +
                        v.dump());
      }
      return c.get<uint32_t>();
    };
    Dim3 d;
    if (v.is_array()) {
      if (v.empty() || v.size() > 3) fail(field, "expected 1 to 3 dimensions, got " + v.dump());
      d.x = component(v[0]);
      if (v.size() > 1) d.y = component(v[1]);
      if (v.size() > 2) d.z = component(v[2]);
    } else {
      d.x = component(v);
    }
    return d;
  }

 private:
  const json& obj_;
  const std::string& source_;
  int line_;
};

KernelProfile parse_profile(const LineReader& r, const std::string& text) {
  if (text == "compute") return KernelProfile::kComputeBound;
  if (text == "memory") return KernelProfile::kMemoryBound;
  if (text == "unknown") return KernelProfile::kUnknown;
  r.fail("profile", "\"" + text + "\" is not one of compute, memory, unknown");
}

struct ParseState {
  std::map<std::string, StreamId> stream_ids;
  std::map<StreamId, StreamClass> stream_classes;
  std::map<std::string, EventId> event_ids;
  struct RequestInfo {
    std::string client;
    std::string after_request;
    int line = 0;
  };
  std::map<std::string, RequestInfo> requests;  // request id -> what its first op said
};

WorkloadOp parse_line(const json& obj, const std::string& source, int line, ParseState& st) {
  LineReader r(obj, source, line);
  if (!obj.is_object()) {
    throw WorkloadError(source + ":" + std::to_string(line) + ": expected a JSON object per line");
  }
  for (const auto& [key, value] : obj.items()) {
    if (!known_fields().count(key)) r.fail(key, "unknown field (see scheduler/workload.h for the format)");
  }
  WorkloadOp op;
  op.line = line;
  if (r.has("arrival_us")) op.arrival_ns = std::llround(r.number("arrival_us", false) * 1000.0);
  if (!r.has("stream")) r.fail("stream", "missing (every op names its stream)");
  op.stream = r.id("stream");
  auto [sit, new_stream] = st.stream_ids.emplace(op.stream, st.stream_ids.size() + 1);
  op.stream_id = sit->second;
  if (r.has("class")) {
    std::string text = r.str("class");
    if (!parse_stream_class(text, &op.cls)) {
      r.fail("class", "\"" + text + "\" is not one of high_priority, best_effort, communication, unmanaged");
    }
    if (!new_stream && st.stream_classes[op.stream_id] != op.cls) {
      r.fail("class", "stream \"" + op.stream + "\" was " + to_string(st.stream_classes[op.stream_id]) +
                          " on an earlier line; a stream keeps one class");
    }
    st.stream_classes[op.stream_id] = op.cls;
  } else if (new_stream) {
    r.fail("class", "missing on the first line of stream \"" + op.stream + "\"");
  } else {
    op.cls = st.stream_classes[op.stream_id];
  }
  if (r.has("kind")) {
    std::string text = r.str("kind");
    if (!parse_op_kind(text, &op.kind)) {
      r.fail("kind", "\"" + text + "\" is not an op kind (kernel, copy, memset, event_record, "
                     "stream_wait_event, host_func, graph_launch, mem_pool)");
    }
  }
  if (r.has("name")) op.name = r.str("name");
  if (op.kind == OpKind::kKernel) {
    if (op.name.empty()) r.fail("name", "missing (kernels need a name)");
    if (!r.has("grid")) r.fail("grid", "missing (kernels need a grid)");
    if (!r.has("block")) r.fail("block", "missing (kernels need a block shape)");
    op.grid = r.dim3("grid", false);
    op.block = r.dim3("block", true);
    if (op.block.count() > 1024) r.fail("block", "a block holds at most 1024 threads (CUDA's limit)");
    if (r.has("block_us") == r.has("duration_us")) {
      r.fail(r.has("block_us") ? "duration_us" : "block_us",
             "kernels need exactly one of block_us (one block alone) and duration_us (whole kernel alone)");
    }
  }
  if (!op.name.empty()) op.kernel_id = fnv1a(op.name);
  if (r.has("smem")) op.smem = static_cast<uint32_t>(std::min<uint64_t>(r.count("smem"), UINT32_MAX));
  if (r.has("blocks_per_sm")) {
    uint64_t bps = r.count("blocks_per_sm");
    if (bps == 0 || bps > 32) r.fail("blocks_per_sm", "expected 1 to 32, got " + std::to_string(bps));
    op.blocks_per_sm = static_cast<uint32_t>(bps);
  }
  if (r.has("block_us")) op.block_ns = r.number("block_us", true) * 1000.0;
  if (r.has("duration_us")) op.duration_ns = r.number("duration_us", true) * 1000.0;
  if (op.kind == OpKind::kGraphLaunch && op.block_ns == 0) op.block_ns = op.duration_ns;
  if (r.has("profile")) op.profile = parse_profile(r, r.str("profile"));
  if (r.has("bytes")) op.bytes = r.count("bytes");
  if ((op.kind == OpKind::kCopy || op.kind == OpKind::kMemset) && !r.has("bytes")) {
    r.fail("bytes", std::string("missing (") + to_string(op.kind) + " ops need a size)");
  }
  if (op.kind == OpKind::kEventRecord || op.kind == OpKind::kStreamWaitEvent) {
    if (!r.has("event")) r.fail("event", std::string("missing (") + to_string(op.kind) + " needs an event)");
    std::string name = r.id("event");
    op.event = st.event_ids.emplace(name, st.event_ids.size() + 1).first->second;
  }
  op.client = r.has("client") ? r.id("client") : op.stream;
  op.request = r.has("request") ? r.id("request") : "#" + std::to_string(line);
  if (r.has("after_request")) op.after_request = r.id("after_request");
  if (r.has("after_us")) {
    if (op.after_request.empty()) r.fail("after_us", "only meaningful with after_request");
    op.after_ns = std::llround(r.number("after_us", false) * 1000.0);
  }
  auto known = st.requests.find(op.request);
  if (known == st.requests.end()) {
    if (!op.after_request.empty() && !st.requests.count(op.after_request)) {
      r.fail("after_request", "request \"" + op.after_request + "\" does not appear on an earlier line");
    }
    st.requests[op.request] = {op.client, op.after_request, line};
  } else {
    const auto& info = known->second;
    if (info.client != op.client) {
      r.fail("request", "request \"" + op.request + "\" belongs to client \"" + info.client + "\" (line " +
                            std::to_string(info.line) + "); request ids are global");
    }
    if (info.after_request != op.after_request) {
      r.fail("after_request", "request \"" + op.request + "\" has after_request \"" + info.after_request +
                                  "\" on line " + std::to_string(info.line) + "; all its ops must agree");
    }
  }
  return op;
}

}  // namespace

Workload parse_workload(std::istream& in, const std::string& source_name) {
  Workload w;
  w.source = source_name;
  ParseState st;
  std::string text;
  int line = 0;
  while (std::getline(in, text)) {
    ++line;
    auto first = text.find_first_not_of(" \t\r");
    if (first == std::string::npos || text[first] == '#') continue;
    json obj;
    try {
      obj = json::parse(text);
    } catch (const json::parse_error& e) {
      throw WorkloadError(source_name + ":" + std::to_string(line) + ": not valid JSON (" + e.what() + ")");
    }
    w.ops.push_back(parse_line(obj, source_name, line, st));
  }
  if (w.ops.empty()) throw WorkloadError(source_name + ": no ops (empty workload)");
  return w;
}

Workload load_workload(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw WorkloadError(path + ": cannot open workload file (check the path)");
  return parse_workload(in, path);
}

std::vector<std::string> Workload::clients() const {
  std::set<std::string> names;
  for (const WorkloadOp& op : ops) names.insert(op.client);
  return {names.begin(), names.end()};
}

Workload Workload::only_client(const std::string& client) const {
  Workload w;
  w.source = source + " (client " + client + ")";
  for (const WorkloadOp& op : ops) {
    if (op.client == client) w.ops.push_back(op);
  }
  return w;
}

KernelInfo Workload::kernel_info(const WorkloadOp& op, Device& device) const {
  KernelInfo k;
  k.id = op.kernel_id;
  k.name = op.name.empty() ? nullptr : op.name.c_str();
  k.grid = op.grid;
  k.block = op.block;
  k.shared_mem_bytes = op.smem;
  k.profile_hint = op.profile;
  k.sim_blocks_per_sm = op.blocks_per_sm;
  k.sim_block_ns = op.block_ns;
  if (op.kind == OpKind::kKernel && op.duration_ns > 0) {
    int per_sm = std::max(1, device.max_active_blocks_per_sm(k));
    uint64_t slots = static_cast<uint64_t>(per_sm) * static_cast<uint64_t>(device.sm_count());
    uint64_t waves = std::max<uint64_t>(1, (op.grid.count() + slots - 1) / slots);
    k.sim_block_ns = op.duration_ns / static_cast<double>(waves);
  }
  return k;
}

RequestGraph request_graph(const Workload& w) {
  RequestGraph g;
  g.op_request.resize(w.ops.size());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < w.ops.size(); ++i) {
    const WorkloadOp& op = w.ops[i];
    auto [it, is_new] = index.emplace(op.request, g.requests.size());
    if (is_new) {
      WorkloadRequest r;
      r.result.client = op.client;
      r.result.request = op.request;
      r.result.cls = op.cls;
      g.requests.push_back(std::move(r));
      auto pred = index.find(op.after_request);
      if (!op.after_request.empty() && pred != index.end()) {
        g.requests[pred->second].followers.push_back(it->second);
        g.requests[it->second].closed_loop = true;
      }
    }
    g.op_request[i] = it->second;
    g.requests[it->second].ops.push_back(i);
  }
  return g;
}

}  // namespace sched
