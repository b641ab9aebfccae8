// ChildResult <-> JSON (run_json.h). Numbers keep full precision (nanosecond integers, doubles as
// nlohmann writes them), so the parent's table equals what the child measured.
#include "run_json.h"

#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace replay_gpu {

using nlohmann::json;

namespace {

sched::StreamClass class_from(const json& j) {
  sched::StreamClass cls{};
  if (!sched::parse_stream_class(j.get<std::string>(), &cls)) {
    throw std::runtime_error("unknown stream class " + j.dump());
  }
  return cls;
}

}  // namespace

json to_json(const sched::ReplayResult& r) {
  json requests = json::array();
  for (const sched::RequestResult& q : r.requests) {
    requests.push_back({{"client", q.client},
                        {"request", q.request},
                        {"class", sched::to_string(q.cls)},
                        {"arrival_ns", q.arrival_ns},
                        {"done_ns", q.done_ns},
                        {"first_start_ns", q.first_start_ns},
                        {"ops", q.ops}});
  }
  return {{"policy", r.policy},
          {"makespan_ns", r.makespan_ns},
          {"sm_utilisation", r.sm_utilisation},
          {"ops_completed", r.ops_completed},
          {"forced_by_starvation", r.forced_by_starvation},
          {"start_be_sms", r.start_be_sms},
          {"final_be_sms", r.final_be_sms},
          {"partition_resizes", r.partition_resizes},
          {"mean_be_sms", r.mean_be_sms},
          {"requests", requests}};
}

sched::ReplayResult replay_result_from_json(const json& j) {
  try {
    sched::ReplayResult r;
    r.policy = j.at("policy").get<std::string>();
    r.makespan_ns = j.at("makespan_ns").get<int64_t>();
    r.sm_utilisation = j.at("sm_utilisation").get<double>();
    r.ops_completed = j.at("ops_completed").get<uint64_t>();
    r.forced_by_starvation = j.at("forced_by_starvation").get<uint64_t>();
    // The simulator's best-effort partition (a GPU run does not see the shim's: 0).
    r.start_be_sms = j.value("start_be_sms", 0);
    r.final_be_sms = j.value("final_be_sms", 0);
    r.partition_resizes = j.value("partition_resizes", uint64_t{0});
    r.mean_be_sms = j.value("mean_be_sms", 0.0);
    for (const json& q : j.at("requests")) {
      sched::RequestResult rr;
      rr.client = q.at("client").get<std::string>();
      rr.request = q.at("request").get<std::string>();
      rr.cls = class_from(q.at("class"));
      rr.arrival_ns = q.at("arrival_ns").get<int64_t>();
      rr.done_ns = q.at("done_ns").get<int64_t>();
      rr.first_start_ns = q.at("first_start_ns").get<int64_t>();
      rr.ops = q.at("ops").get<size_t>();
      r.requests.push_back(std::move(rr));
    }
    return r;
  } catch (const json::exception& e) {
    throw std::runtime_error(std::string("replay result: ") + e.what());
  }
}

json to_json(const ChildResult& c) {
  json alone = json::array();
  for (const sched::ReplayResult& r : c.alone) alone.push_back(to_json(r));
  return {{"label", c.label},
          {"policy", c.policy},
          {"shim_loaded", c.shim_loaded},
          {"shim_active", c.shim_active},
          {"gpu",
           {{"name", c.gpu.name},
            {"sm_count", c.gpu.sm_count},
            {"cc_major", c.gpu.cc_major},
            {"cc_minor", c.gpu.cc_minor},
            {"clock_khz", c.gpu.clock_khz},
            {"driver_version", c.gpu.driver_version}}},
          {"h2d_gbps", c.h2d_gbps},
          {"copy_scale", c.copy_scale},
          {"timer", c.timer},
          {"alone", alone},
          {"together", to_json(c.together)},
          {"issue_lag_p99_us", c.issue_lag_p99_us},
          {"issue_lag_max_us", c.issue_lag_max_us}};
}

ChildResult child_result_from_json(const json& j) {
  try {
    ChildResult c;
    c.label = j.at("label").get<std::string>();
    c.policy = j.at("policy").get<std::string>();
    c.shim_loaded = j.at("shim_loaded").get<bool>();
    c.shim_active = j.at("shim_active").get<bool>();
    const json& g = j.at("gpu");
    c.gpu.name = g.at("name").get<std::string>();
    c.gpu.sm_count = g.at("sm_count").get<int>();
    c.gpu.cc_major = g.at("cc_major").get<int>();
    c.gpu.cc_minor = g.at("cc_minor").get<int>();
    c.gpu.clock_khz = g.at("clock_khz").get<int>();
    c.gpu.driver_version = g.at("driver_version").get<int>();
    c.h2d_gbps = j.at("h2d_gbps").get<double>();
    c.copy_scale = j.at("copy_scale").get<double>();
    c.timer = j.at("timer").get<std::string>();
    for (const json& r : j.at("alone")) c.alone.push_back(replay_result_from_json(r));
    c.together = replay_result_from_json(j.at("together"));
    c.issue_lag_p99_us = j.at("issue_lag_p99_us").get<double>();
    c.issue_lag_max_us = j.at("issue_lag_max_us").get<double>();
    return c;
  } catch (const json::exception& e) {
    throw std::runtime_error(std::string("child result: ") + e.what());
  }
}

void write_child_result(const std::string& path, const ChildResult& result) {
  std::ofstream out(path);
  if (!out || !(out << to_json(result).dump() << "\n")) throw std::runtime_error("cannot write " + path);
}

ChildResult read_child_result(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": the replay process wrote no result");
  try {
    return child_result_from_json(json::parse(in));
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

}  // namespace replay_gpu
