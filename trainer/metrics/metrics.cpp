// Metrics: MFU peaks, JSONL records, and the end-of-run summary.
#include "trainer/metrics/metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "trainer/tensorboard/event_writer.h"

namespace gpipe {

std::optional<double> peak_flops_for_device_name(const std::string& device_name) {
  std::string name;
  for (char c : device_name) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // Dense bf16 tensor-core peaks from the vendor data sheets (no sparsity: half the sheets'
  // "with sparsity" figure). scripts/peers/bench_common.py's peak_bf16_flops_for_name() has the
  // same rules, so ours and the peers' MFU share a peak.
  if (has("H100") || has("H200") || has("H800")) {
    if (has("PCIE")) return 756e12;
    if (has("NVL")) return 835e12;  // H100 NVL, H200 NVL: 1,671 TFLOPS with sparsity
    return 989e12;                   // SXM (and GH200)
  }
  if (has("A100") || has("A800")) return 312e12;
  if (has("L40S")) return 362e12;
  if (has("A10")) return 125e12;
  if (has("V100")) return 125e12;
  return std::nullopt;
}

std::optional<double> peak_flops_override_from_env() {
  const char* value = std::getenv("OURGPIPE_PEAK_TFLOPS");
  if (value == nullptr || *value == '\0') return std::nullopt;
  char* end = nullptr;
  const double tflops = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(tflops > 0)) {
    throw std::invalid_argument(fmt::format(
        "OURGPIPE_PEAK_TFLOPS='{}' is not a positive number: give the GPU's peak in TFLOP/s, e.g. 989", value));
  }
  return tflops * 1e12;
}

int64_t max_rss_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {
template <typename T>
nlohmann::json optional_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
}  // namespace

nlohmann::json to_json(const IterationMetrics& m) {
  return {{"step", m.step},
          {"epoch", m.epoch},
          {"loss", m.loss},
          {"lr", m.learning_rate},
          {"grad_norm", m.grad_norm},
          {"step_time_ms", m.step_time_ms},
          {"end_unix_s", m.end_unix_s},
          {"tokens_per_s", m.tokens_per_s},
          {"bubble_fraction", m.bubble_fraction},
          {"bubble_clock", m.bubble_clock},
          {"mfu", optional_json(m.mfu)},
          {"peak_memory_bytes", m.peak_memory_bytes},
          {"peak_allocated_bytes", m.peak_allocated_bytes},
          {"rank_busy", m.rank_busy},
          {"scheduler_held", optional_json(m.scheduler_held)},
          {"scheduler_admitted", optional_json(m.scheduler_admitted)},
          {"device_mallocs", optional_json(m.device_mallocs)},
          {"device_frees", optional_json(m.device_frees)},
          {"alloc_retries", optional_json(m.alloc_retries)},
          {"reserved_peak_bytes", optional_json(m.reserved_peak_bytes)},
          {"profiled", m.profiled}};
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const IterationMetrics& m) {
  std::vector<std::pair<std::string, double>> s{{"train/loss", m.loss},
                                                {"train/learning_rate", m.learning_rate},
                                                {"train/grad_norm", m.grad_norm},
                                                {"throughput/tokens_per_s", m.tokens_per_s},
                                                {"throughput/step_time_ms", m.step_time_ms}};
  if (m.mfu) s.emplace_back("throughput/mfu", *m.mfu);
  s.emplace_back("pipeline/bubble_fraction", m.bubble_fraction);
  for (size_t r = 0; r < m.rank_busy.size(); ++r) s.emplace_back(fmt::format("pipeline/rank{}_busy", r), m.rank_busy[r]);
  s.emplace_back("memory/peak_MiB", static_cast<double>(m.peak_memory_bytes) / (1024.0 * 1024.0));
  if (m.scheduler_held) s.emplace_back("scheduler/held", static_cast<double>(*m.scheduler_held));
  if (m.scheduler_admitted) s.emplace_back("scheduler/admitted", static_cast<double>(*m.scheduler_admitted));
  if (m.device_mallocs) s.emplace_back("memory/device_mallocs", static_cast<double>(*m.device_mallocs));
  if (m.alloc_retries) s.emplace_back("memory/alloc_retries", static_cast<double>(*m.alloc_retries));
  if (m.reserved_peak_bytes) s.emplace_back("memory/reserved_peak_MiB", static_cast<double>(*m.reserved_peak_bytes) / (1024.0 * 1024.0));
  return s;
}

MetricsLog::MetricsLog(const std::string& output_dir, RunInfo info)
    : output_dir_(output_dir), info_(std::move(info)),
      jsonl_path_((std::filesystem::path(output_dir) / "metrics.jsonl").string()) {
  std::error_code ec;
  std::filesystem::create_directories(output_dir_, ec);
  std::ofstream probe(jsonl_path_, std::ios::app);  // writable, and nothing truncated before begin_at
  if (!probe) {
    // invalid_argument: the user's to fix (exit 2, as for --checkpoint-dir), not a run failure.
    throw std::invalid_argument("cannot write metrics to '" + jsonl_path_ +
                                "': set training.output_dir to a writable folder");
  }
  if (TensorBoardEventWriter::unavailable_reason() == nullptr) {
    tensorboard_ = std::make_unique<TensorBoardEventWriter>(output_dir_);
  }
}

MetricsLog::~MetricsLog() = default;
MetricsLog::MetricsLog(MetricsLog&&) noexcept = default;

std::optional<std::string> MetricsLog::tensorboard_path() const {
  if (!tensorboard_) return std::nullopt;
  return tensorboard_->path();
}

const char* MetricsLog::tensorboard_unavailable_reason() { return TensorBoardEventWriter::unavailable_reason(); }

std::optional<double> MetricsLog::mfu(double tokens_per_s) const {
  if (!info_.peak_flops_per_gpu || info_.num_gpus <= 0 || info_.flops_per_token <= 0) return std::nullopt;
  return info_.flops_per_token * tokens_per_s / (*info_.peak_flops_per_gpu * info_.num_gpus);
}

void MetricsLog::begin_at(int64_t first_step, bool resumed) {
  std::string kept;
  if (resumed) {
    std::ifstream in(jsonl_path_);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      // Lines of steps this run takes again (after the checkpoint), or that are not ours, go.
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<int64_t>() < first_step) {
        kept += line + '\n';
      }
    }
  }
  if (resumed) {
    // The kept lines go to a new file that replaces the old one whole: a crash in between leaves
    // the earlier history, not a truncated file.
    const std::string fresh = jsonl_path_ + ".tmp";
    {
      std::ofstream out(fresh, std::ios::trunc);
      out << kept;
      out.flush();
      if (!out) throw std::runtime_error("cannot write metrics to '" + fresh + "' (disk full, or not writable?)");
    }
    std::error_code ec;
    std::filesystem::rename(fresh, jsonl_path_, ec);
    if (ec) throw std::runtime_error("cannot replace '" + jsonl_path_ + "' with '" + fresh + "': " + ec.message());
    jsonl_.open(jsonl_path_, std::ios::app);
  } else {
    jsonl_.open(jsonl_path_, std::ios::trunc);
  }
  if (!jsonl_) throw std::runtime_error("cannot write metrics to '" + jsonl_path_ + "'");
}

void MetricsLog::add(const IterationMetrics& m) {
  if (!jsonl_.is_open()) throw std::logic_error("MetricsLog::add before begin_at");
  iterations_.push_back(m);
  jsonl_ << to_json(m).dump() << '\n';
  jsonl_.flush();
  if (!jsonl_) {
    throw std::runtime_error(fmt::format("writing step {}'s metrics to '{}' failed (disk full?)", m.step, jsonl_path_));
  }
  if (tensorboard_) tensorboard_->add_scalars(m.step, tensorboard_scalars(m));
}

namespace {
// The steady-state iterations: all but the first and the profiled ones (a profiled step runs
// with the profiler's overhead). Too few steps for that: the unprofiled ones, else all.
std::vector<IterationMetrics> steady(const std::vector<IterationMetrics>& all) {
  std::vector<IterationMetrics> out;
  for (size_t i = 1; i < all.size(); ++i) {
    if (!all[i].profiled) out.push_back(all[i]);
  }
  if (!out.empty()) return out;
  for (const auto& m : all) {
    if (!m.profiled) out.push_back(m);
  }
  return out.empty() ? all : out;
}
double mean_of(const std::vector<IterationMetrics>& its, double IterationMetrics::*field) {
  if (its.empty()) return 0.0;
  double sum = 0;
  for (const auto& m : its) sum += m.*field;
  return sum / static_cast<double>(its.size());
}
}  // namespace

nlohmann::json MetricsLog::summary() const {
  const auto its = steady(iterations_);
  const double step_ms = mean_of(its, &IterationMetrics::step_time_ms);
  const double tokens_per_s = step_ms > 0 ? static_cast<double>(info_.tokens_per_step) / (step_ms / 1e3) : 0.0;
  const auto mfu_value = mfu(tokens_per_s);
  int64_t peak_memory = 0;
  int64_t peak_allocated = -1;
  for (const auto& m : iterations_) {
    peak_memory = std::max(peak_memory, m.peak_memory_bytes);
    peak_allocated = std::max(peak_allocated, m.peak_allocated_bytes);
  }
  // The allocator's traffic after the first step (a warm step should make no cudaMalloc), and its
  // retries over the run; null on CPU.
  std::optional<int64_t> steady_mallocs, retries;
  for (size_t i = 0; i < iterations_.size(); ++i) {
    const auto& m = iterations_[i];
    if (m.alloc_retries) retries = retries.value_or(0) + *m.alloc_retries;
    if (i > 0 && m.device_mallocs) steady_mallocs = steady_mallocs.value_or(0) + *m.device_mallocs;
  }
  return {{"tokens_per_s", tokens_per_s},
          {"mfu", optional_json(mfu_value)},
          {"bubble_fraction", mean_of(its, &IterationMetrics::bubble_fraction)},
          {"bubble_clock", iterations_.empty() ? std::string("host") : iterations_.back().bubble_clock},
          {"peak_memory_bytes", peak_memory},
          {"peak_allocated_bytes", peak_allocated},
          {"step_time_ms_mean", step_ms},
          {"step_time_ms_first", iterations_.empty() ? 0.0 : iterations_.front().step_time_ms},
          {"device_mallocs_after_first_step", optional_json(steady_mallocs)},
          {"alloc_retries", optional_json(retries)},
          {"final_loss", iterations_.empty() ? nlohmann::json(nullptr) : nlohmann::json(iterations_.back().loss)},
          {"first_loss", iterations_.empty() ? nlohmann::json(nullptr) : nlohmann::json(iterations_.front().loss)},
          {"steps", iterations_.size()},
          {"schedule", info_.schedule},
          {"executor", info_.executor},
          {"ranks", info_.ranks},
          {"stages", info_.stages},
          {"microbatches", info_.microbatches},
          {"device", info_.device},
          {"device_name", info_.device_name},
          {"dtype", info_.dtype},
          {"attention", info_.attention},
          {"priority", info_.priority},
          {"parameters", info_.parameters},
          {"tokens_per_step", info_.tokens_per_step},
          {"flops_per_token", info_.flops_per_token},
          {"peak_flops_per_gpu", optional_json(info_.peak_flops_per_gpu)},
          {"num_gpus", info_.num_gpus},
          {"use_orion_scheduler", info_.use_orion_scheduler},
          {"orion_env", info_.orion_env}};
}

std::string MetricsLog::write_summary() const {
  const std::string path = (std::filesystem::path(output_dir_) / "summary.json").string();
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write the summary to '" + path + "'");
  out << summary().dump(2) << '\n';
  out.flush();
  if (!out) throw std::runtime_error("writing the summary to '" + path + "' failed (disk full?)");
  return path;
}

std::string MetricsLog::summary_text() const {
  const auto s = summary();
  const std::string mfu_text = s["mfu"].is_null()
                                   ? std::string(info_.device == "cpu" ? "n/a (CPU)" : "n/a (unknown GPU peak; set OURGPIPE_PEAK_TFLOPS)")
                                   : fmt::format("{:.2f}%", 100.0 * s["mfu"].get<double>());
  std::string text;
  text += "==================== Training summary ====================\n";
  text += fmt::format("schedule {} | executor {} | {} ranks x {} stages | {} micro-batches\n", info_.schedule,
                      info_.executor, info_.ranks, info_.stages, info_.microbatches);
  text += fmt::format("device {} ({}) | dtype {} | attention {} | priority {} | orion {} (USE_ORION_SCHEDULER={})\n",
                      info_.device, info_.device_name, info_.dtype, info_.attention, info_.priority, info_.use_orion_scheduler ? "on" : "off",
                      info_.orion_env.empty() ? "unset" : info_.orion_env);
  text += fmt::format("steps {} | loss {:.4f} -> {:.4f}\n", s["steps"].get<size_t>(),
                      s["first_loss"].is_null() ? 0.0 : s["first_loss"].get<double>(),
                      s["final_loss"].is_null() ? 0.0 : s["final_loss"].get<double>());
  text += fmt::format("step time {:.1f} ms (mean, first step {:.1f} ms) | throughput {:.1f} tokens/s\n",
                      s["step_time_ms_mean"].get<double>(), s["step_time_ms_first"].get<double>(),
                      s["tokens_per_s"].get<double>());
  text += fmt::format("MFU {} | bubble {:.1f}% ({} clock) | peak memory {:.1f} MiB\n", mfu_text,
                      100.0 * s["bubble_fraction"].get<double>(), s["bubble_clock"].get<std::string>(),
                      static_cast<double>(s["peak_memory_bytes"].get<int64_t>()) / (1024.0 * 1024.0));
  if (!s["alloc_retries"].is_null()) {
    text += fmt::format("CUDA allocator: {} cudaMalloc after the first step | {} retried allocation(s)\n",
                        s["device_mallocs_after_first_step"].is_null() ? int64_t{0} : s["device_mallocs_after_first_step"].get<int64_t>(),
                        s["alloc_retries"].get<int64_t>());
  }
  text += "==========================================================";
  return text;
}

}  // namespace gpipe
