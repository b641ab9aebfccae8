// PipelineConfig: YAML load/save (yaml-cpp), per-field checks, "section.field=value" overrides
// (the cross-field rules are in config_rules.cpp). Every field is described once in field_table(); loading, emitting,
// overriding and validating all walk that table, so a new field needs one line there.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <functional>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "trainer/config/config.h"

#include "config_rules.h"

namespace gpipe {
namespace {

std::string number_text(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}
template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) return "'" + v + "'";
  else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_floating_point_v<T>) return number_text(v);
  else if constexpr (std::is_integral_v<T>) return std::to_string(v);
  else {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + value_text(v[i]);
    return s + "]";
  }
}
template <class T>
const char* type_text() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "a list of integers, e.g. [12, 13, 13, 11]";
  else return "a list of numbers, e.g. [0.0, 0.5]";
}

std::string location(const YAML::Mark& mark, const std::string& origin) {
  if (mark.is_null()) return origin + ": ";
  return origin + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1) + ": ";
}

// Whether `s` is an integer written in decimal: an optional '-', then digits without a leading
// zero ("0" itself aside). yaml-cpp follows YAML 1.1, where 010 is octal 8 and 0x10 is 16: a
// --microbatches 010 trained 8 micro-batches.
bool decimal_integer(const std::string& s) {
  const size_t digits = !s.empty() && s[0] == '-' ? 1 : 0;
  if (s.size() == digits) return false;
  for (size_t i = digits; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return s[digits] != '0' || s.size() == digits + 1;
}

// Reads one scalar strictly (yaml-cpp rejects "3.5" as an int and "abc" as a number).
template <class T>
T read_scalar(const YAML::Node& node) {
  if (!node.IsScalar()) throw YAML::TypedBadConversion<T>(node.Mark());
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const std::string& s = node.Scalar();
    if (!decimal_integer(s) || (std::is_unsigned_v<T> && s[0] == '-')) throw YAML::TypedBadConversion<T>(node.Mark());
  }
  return node.as<T>();
}
template <class T>
T read_value(const YAML::Node& node) {
  if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
    if (!node.IsSequence()) throw YAML::TypedBadConversion<T>(node.Mark());
    T out;
    for (const YAML::Node& item : node) out.push_back(read_scalar<typename T::value_type>(item));
    return out;
  } else {
    return read_scalar<T>(node);
  }
}

struct Field {
  std::string section, key;
  bool is_string = false;
  std::string type;  // "an integer", ...
  std::function<void(PipelineConfig&, const YAML::Node&)> read;  // throws YAML::BadConversion
  std::function<void(YAML::Emitter&, const PipelineConfig&)> write;
  // Empty when the value is allowed; otherwise what is wrong and what is allowed.
  std::function<std::string(const PipelineConfig&)> problem;
  // A string field that also takes a YAML list (parallel.partition: [12, 13, 13, 11]); an
  // override value starting with '[' is then read as YAML.
  bool takes_list = false;
  std::string path() const { return section + "." + key; }
};

// `access` returns a reference to the field; the const_casts below let one accessor serve both
// reading into and writing out of a config (write/problem only read through it).
template <class T, class Access>
Field field(const char* section, const char* key, Access access, std::string allowed,
            std::function<bool(const T&)> ok = nullptr) {
  Field f;
  f.section = section;
  f.key = key;
  f.is_string = std::is_same_v<T, std::string>;
  f.type = type_text<T>();
  f.read = [access](PipelineConfig& c, const YAML::Node& n) { access(c) = read_value<T>(n); };
  f.write = [access](YAML::Emitter& out, const PipelineConfig& c) {
    const T& v = access(const_cast<PipelineConfig&>(c));
    if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& x : v) out << YAML::Value << value_text(x);
      out << YAML::EndSeq;
    } else if constexpr (std::is_same_v<T, std::string>) {
      out << v;
    } else {
      out << value_text(v);
    }
  };
  f.problem = [access, allowed, ok](const PipelineConfig& c) -> std::string {
    const T& v = access(const_cast<PipelineConfig&>(c));
    if (!ok || ok(v)) return "";
    return "got " + value_text(v) + "; allowed: " + allowed;
  };
  return f;
}

// parallel.partition also takes the seed's list form: "partition: [12, 13, 13, 11]" means
// partition: explicit with those partition_layers.
Field partition_field(Field f) {
  f.takes_list = true;
  f.type = "uniform, explicit, parameters, time, or a list of integers (layer counts per stage)";
  auto read_name = f.read;
  f.read = [read_name](PipelineConfig& c, const YAML::Node& n) {
    if (!n.IsSequence()) return read_name(c, n);
    c.parallel.partition_layers = read_value<std::vector<int64_t>>(n);
    c.parallel.partition = "explicit";
  };
  return f;
}

std::function<bool(const std::string&)> one_of(std::vector<std::string> names) {
  return [names](const std::string& v) { return std::find(names.begin(), names.end(), v) != names.end(); };
}
bool finite(double v) { return std::isfinite(v); }

const std::vector<Field>& field_table() {
  using C = PipelineConfig;
  static const std::vector<Field> table = {
      field<std::string>("model", "name", [](C& c) -> auto& { return c.model.name; }, "a non-empty registry key",
                         [](const std::string& v) { return !v.empty(); }),
      field<int64_t>("model", "hidden_size", [](C& c) -> auto& { return c.model.hidden_size; }, "an integer >= 1",
                     [](int64_t v) { return v >= 1; }),
      field<int64_t>("model", "num_layers", [](C& c) -> auto& { return c.model.num_layers; }, "an integer >= 1",
                     [](int64_t v) { return v >= 1; }),
      field<int64_t>("model", "num_heads", [](C& c) -> auto& { return c.model.num_heads; }, "an integer >= 1",
                     [](int64_t v) { return v >= 1; }),
      field<int64_t>("model", "sequence_length", [](C& c) -> auto& { return c.model.sequence_length; },
                     "an integer >= 1", [](int64_t v) { return v >= 1; }),
      field<int64_t>("model", "vocab_size", [](C& c) -> auto& { return c.model.vocab_size; },
                     "-1 (from the tokenizer) or an integer >= 1", [](int64_t v) { return v == -1 || v >= 1; }),
      field<int64_t>("model", "ffn_hidden_size", [](C& c) -> auto& { return c.model.ffn_hidden_size; },
                     "-1 (4 x hidden_size) or an integer >= 1", [](int64_t v) { return v == -1 || v >= 1; }),
      field<double>("model", "dropout", [](C& c) -> auto& { return c.model.dropout; }, "a number in [0, 1)",
                    [](double v) { return v >= 0 && v < 1; }),
      field<std::string>("model", "norm_position", [](C& c) -> auto& { return c.model.norm_position; },
                         "default, pre, post", one_of({"default", "pre", "post"})),
      field<std::string>("model", "attention", [](C& c) -> auto& { return c.model.attention; },
                         "auto, flash, efficient, cudnn, math",
                         one_of({"auto", "flash", "efficient", "cudnn", "math"})),
      field<double>("synthetic", "forward_ms", [](C& c) -> auto& { return c.model.synthetic.forward_ms; },
                    "a number of milliseconds >= 0", [](double v) { return finite(v) && v >= 0; }),
      field<double>("synthetic", "input_grad_ms", [](C& c) -> auto& { return c.model.synthetic.input_grad_ms; },
                    "a number of milliseconds >= 0", [](double v) { return finite(v) && v >= 0; }),
      field<double>("synthetic", "weight_grad_ms", [](C& c) -> auto& { return c.model.synthetic.weight_grad_ms; },
                    "a number of milliseconds >= 0", [](double v) { return finite(v) && v >= 0; }),
      field<double>("synthetic", "activation_bytes_per_token",
                    [](C& c) -> auto& { return c.model.synthetic.activation_bytes_per_token; },
                    "a number of bytes >= 0", [](double v) { return finite(v) && v >= 0 && v < 1e12; }),
      field<std::string>("dataset", "name", [](C& c) -> auto& { return c.dataset.name; }, "a non-empty registry key",
                         [](const std::string& v) { return !v.empty(); }),
      field<int64_t>("dataset", "batch_size", [](C& c) -> auto& { return c.dataset.batch_size; }, "an integer >= 1",
                     [](int64_t v) { return v >= 1; }),
      field<int>("dataset", "num_workers", [](C& c) -> auto& { return c.dataset.num_workers; }, "an integer >= 0",
                 [](int v) { return v >= 0; }),
      field<std::string>("dataset", "path", [](C& c) -> auto& { return c.dataset.path; }, "a file or folder path"),
      field<std::string>("dataset", "tokenizer", [](C& c) -> auto& { return c.dataset.tokenizer; },
                         "byte, sentencepiece", one_of({"byte", "sentencepiece"})),
      field<std::string>("dataset", "tokenizer_model", [](C& c) -> auto& { return c.dataset.tokenizer_model; },
                         "a SentencePiece .model path"),
      field<double>("training", "learning_rate", [](C& c) -> auto& { return c.training.learning_rate; },
                    "a number > 0", [](double v) { return finite(v) && v > 0; }),
      field<int>("training", "epochs", [](C& c) -> auto& { return c.training.epochs; }, "an integer >= 1",
                 [](int v) { return v >= 1; }),
      field<int>("training", "num_microbatches", [](C& c) -> auto& { return c.training.num_microbatches; },
                 "an integer >= 1", [](int v) { return v >= 1; }),
      field<int>("training", "profile_iteration", [](C& c) -> auto& { return c.training.profile_iteration; },
                 "-1 (never) or an integer >= 0", [](int v) { return v >= -1; }),
      field<bool>("training", "exit_after_profile", [](C& c) -> auto& { return c.training.exit_after_profile; },
                  "true or false"),
      field<int64_t>("training", "max_steps", [](C& c) -> auto& { return c.training.max_steps; },
                     "-1 (run the epochs) or an integer >= 1", [](int64_t v) { return v == -1 || v >= 1; }),
      field<double>("training", "weight_decay", [](C& c) -> auto& { return c.training.weight_decay; },
                    "a number >= 0", [](double v) { return finite(v) && v >= 0; }),
      field<double>("training", "grad_clip", [](C& c) -> auto& { return c.training.grad_clip; },
                    "a number (<= 0 turns clipping off)", finite),
      field<int64_t>("training", "warmup_steps", [](C& c) -> auto& { return c.training.warmup_steps; },
                     "an integer >= 0", [](int64_t v) { return v >= 0; }),
      field<double>("training", "min_lr_ratio", [](C& c) -> auto& { return c.training.min_lr_ratio; },
                    "a number in [0, 1]", [](double v) { return v >= 0 && v <= 1; }),
      field<uint64_t>("training", "seed", [](C& c) -> auto& { return c.training.seed; }, "an integer >= 0"),
      field<std::string>("training", "dtype", [](C& c) -> auto& { return c.training.dtype; }, "auto, fp32, bf16",
                         one_of({"auto", "fp32", "bf16"})),
      field<int>("training", "log_interval", [](C& c) -> auto& { return c.training.log_interval; }, "an integer >= 1",
                 [](int v) { return v >= 1; }),
      field<std::string>("training", "output_dir", [](C& c) -> auto& { return c.training.output_dir; },
                         "a non-empty folder path", [](const std::string& v) { return !v.empty(); }),
      field<int64_t>("training", "checkpoint_interval", [](C& c) -> auto& { return c.training.checkpoint_interval; },
                     "0 (never) or an integer >= 1", [](int64_t v) { return v >= 0; }),
      field<std::string>("training", "checkpoint_dir", [](C& c) -> auto& { return c.training.checkpoint_dir; },
                         "a folder path (empty: <output_dir>/checkpoints)"),
      field<int>("training", "keep_checkpoints", [](C& c) -> auto& { return c.training.keep_checkpoints; },
                 "0 (keep all) or an integer >= 1", [](int v) { return v >= 0; }),
      field<int>("parallel", "model_parallel_size", [](C& c) -> auto& { return c.parallel.model_parallel_size; },
                 "an integer >= 1", [](int v) { return v >= 1; }),
      field<std::string>("parallel", "scheduler", [](C& c) -> auto& { return c.parallel.scheduler; },
                         "naive, async_threaded", one_of({"naive", "async_threaded"})),
      field<bool>("parallel", "use_orion_scheduler", [](C& c) -> auto& { return c.parallel.use_orion_scheduler; },
                  "true or false"),
      field<std::string>("parallel", "publish_bubbles_gpu",
                         [](C& c) -> auto& { return c.parallel.publish_bubbles_gpu; },
                         "a GPU UUID served by orion-gpud (empty: do not publish)"),
      field<int>("parallel", "publish_bubbles_rank", [](C& c) -> auto& { return c.parallel.publish_bubbles_rank; },
                 "-1 (every rank of this process) or a pipeline rank", [](int v) { return v >= -1; }),
      field<std::string>("parallel", "schedule", [](C& c) -> auto& { return c.parallel.schedule; },
                         "gpipe, 1f1b, interleaved_1f1b, zb_h1, looped_bfs, interleaved_zb, zbv, dualpipev",
                         one_of({"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "looped_bfs", "interleaved_zb", "zbv",
                                 "dualpipev"})),
      field<std::string>("parallel", "schedule_file", [](C& c) -> auto& { return c.parallel.schedule_file; },
                         "a schedule CSV path (empty: generate parallel.schedule)"),
      field<int>("parallel", "virtual_stages", [](C& c) -> auto& { return c.parallel.virtual_stages; },
                 "an integer >= 1", [](int v) { return v >= 1; }),
      field<std::string>("parallel", "overlap_f_b", [](C& c) -> auto& { return c.parallel.overlap_f_b; },
                         "auto, true, false", one_of({"auto", "true", "false"})),
      field<std::string>("parallel", "sync_mode", [](C& c) -> auto& { return c.parallel.sync_mode; },
                         "bsp, asp", one_of({"bsp", "asp"})),
      field<bool>("parallel", "weight_stashing", [](C& c) -> auto& { return c.parallel.weight_stashing; },
                  "true or false"),
      field<int>("parallel", "asp_window_steps", [](C& c) -> auto& { return c.parallel.asp_window_steps; },
                 "an integer >= 0 (0: until a checkpoint, the profiled step or the epoch's end)",
                 [](int v) { return v >= 0; }),
      field<std::string>("parallel", "priority", [](C& c) -> auto& { return c.parallel.priority; },
                         "backward_first, forward_first, none", one_of({"backward_first", "forward_first", "none"})),
      field<std::string>("parallel", "streams", [](C& c) -> auto& { return c.parallel.streams; },
                         "per_microbatch, per_rank", one_of({"per_microbatch", "per_rank"})),
      partition_field(field<std::string>("parallel", "partition", [](C& c) -> auto& { return c.parallel.partition; },
                                         "uniform, explicit, parameters, time, or a list of per-stage layer counts",
                                         one_of({"uniform", "explicit", "parameters", "time"}))),
      field<std::string>("parallel", "partition_file", [](C& c) -> auto& { return c.parallel.partition_file; },
                         "a VPipe partition JSON path (empty: none)"),
      field<std::vector<int64_t>>("parallel", "partition_layers", [](C& c) -> auto& { return c.parallel.partition_layers; },
                                  "a list of per-stage layer counts, each >= 1", [](const std::vector<int64_t>& v) {
                                    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 1; });
                                  }),
      field<std::vector<double>>("parallel", "recompute_ratio", [](C& c) -> auto& { return c.parallel.recompute_ratio; },
                                 "a list of per-stage ratios, each in [0, 1]", [](const std::vector<double>& v) {
                                   return std::all_of(v.begin(), v.end(), [](double x) { return x >= 0 && x <= 1; });
                                 }),
      field<std::string>("parallel", "device", [](C& c) -> auto& { return c.parallel.device; }, "auto, cpu, cuda",
                         one_of({"auto", "cpu", "cuda"})),
      field<std::string>("parallel", "transport", [](C& c) -> auto& { return c.parallel.transport; },
                         "auto, inprocess, gloo, nccl", one_of({"auto", "inprocess", "gloo", "nccl"})),
      field<std::vector<int64_t>>("parallel", "placement", [](C& c) -> auto& { return c.parallel.placement; },
                                  "a list with the process (0..WORLD_SIZE-1) of each pipeline rank",
                                  [](const std::vector<int64_t>& v) {
                                    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 0; });
                                  }),
      field<int>("parallel", "data_parallel_size", [](C& c) -> auto& { return c.parallel.data_parallel_size; },
                 "an integer >= 1", [](int v) { return v >= 1; }),
      field<double>("parallel", "dp_bucket_mb", [](C& c) -> auto& { return c.parallel.dp_bucket_mb; },
                    "a number of MiB > 0", [](double v) { return finite(v) && v > 0; }),
      field<double>("parallel", "peer_timeout_s", [](C& c) -> auto& { return c.parallel.peer_timeout_s; },
                    // Whole milliseconds up to a year: the waits take milliseconds (a larger value
                    // overflowed into a negative wait, a smaller one truncated to none).
                    "a number of seconds from 0.001 to 31536000 (a year)",
                    [](double v) { return finite(v) && v >= 0.001 && v <= 31'536'000.0; }),
  };
  return table;
}

const std::vector<std::string> kSections = {"model", "synthetic", "dataset", "training", "parallel"};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// " (did you mean X?)" when a known name is close, else a list of the known names.
std::string suggestion(const std::string& wrong, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, wrong.size() / 3) + 1;
  for (const std::string& k : known) {
    const size_t d = edit_distance(wrong, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  if (!best.empty()) return " (did you mean '" + best + "'?)";
  std::string list;
  for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
  return "; known: " + list;
}

const Field* find_field(const std::string& section, const std::string& key) {
  for (const Field& f : field_table())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

std::string unknown_field_message(const std::string& section, const std::string& key) {
  std::vector<std::string> in_section, everywhere;
  for (const Field& f : field_table()) {
    if (f.section == section) in_section.push_back(f.path());
    everywhere.push_back(f.path());
    if (f.key == key) return "unknown key '" + section + "." + key + "' (did you mean '" + f.path() + "'?)";
  }
  return "unknown key '" + section + "." + key + "'" + suggestion(section + "." + key, in_section);
}

// Reads `node` into field `f`, turning yaml-cpp's conversion errors into a ConfigError.
// `origin` is a file name (errors get file:line:column) or an override (no lines to give).
void read_field(PipelineConfig& c, const Field& f, const YAML::Node& node, const std::string& origin,
                bool has_lines = true) {
  auto location = [&](const YAML::Mark& mark, const std::string& o) {
    return has_lines ? gpipe::location(mark, o) : o + ": ";
  };
  try {
    f.read(c, node);
  } catch (const YAML::Exception& e) {
    std::string got = node.IsScalar()     ? "'" + node.Scalar() + "'"
                      : node.IsSequence() ? "a list"
                      : node.IsMap()      ? "a map"
                                          : "nothing";
    if (node.IsSequence()) {  // name the entry that did not convert (the error carries its mark)
      size_t index = 0;
      for (const YAML::Node& item : node) {
        ++index;
        if (item.Mark().pos != e.mark.pos || item.Mark().line != e.mark.line) continue;
        got = "a list whose entry " + std::to_string(index) + " is " +
              (item.IsScalar() ? "'" + item.Scalar() + "'" : item.IsSequence() ? "a list" : "a map");
        break;
      }
    }
    throw ConfigError(location(node.Mark(), origin) + f.path() + ": expected " + f.type + ", got " + got);
  }
  if (std::string p = f.problem(c); !p.empty()) throw ConfigError(location(node.Mark(), origin) + f.path() + ": " + p);
}

YAML::Node parse_yaml(const std::string& text, const std::string& origin) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(location(e.mark, origin) + "not valid YAML: " + e.msg);
  }
  // YAML::Load read the first document only: what followed a '---' was dropped unread.
  if (documents.size() > 1) {
    throw ConfigError(location(documents[1].Mark(), origin) + "a second YAML document (after '---'); a config is one "
                      "YAML document: merge them, or pass the second with --set");
  }
  return documents.empty() ? YAML::Node() : documents.front();
}

// A key must be a plain scalar; a second occurrence of a key is an error (yaml-cpp keeps both).
std::string key_text(const YAML::Node& key, std::vector<std::string>& seen, const std::string& parent,
                     const std::string& origin) {
  if (!key.IsScalar()) throw ConfigError(location(key.Mark(), origin) + "keys must be plain names");
  const std::string name = key.Scalar();
  if (std::find(seen.begin(), seen.end(), name) != seen.end())
    throw ConfigError(location(key.Mark(), origin) + "duplicate key '" + parent + name + "'");
  seen.push_back(name);
  return name;
}

}  // namespace

PipelineConfig PipelineConfig::from_yaml_string(const std::string& text, const std::string& origin) {
  PipelineConfig c;
  const YAML::Node root = parse_yaml(text, origin);
  if (root.IsNull()) return c;  // an empty document: all defaults
  if (!root.IsMap())
    throw ConfigError(location(root.Mark(), origin) + "expected a map with sections model, dataset, training, parallel");
  std::vector<std::string> sections_seen;
  for (const auto& section : root) {
    const std::string name = key_text(section.first, sections_seen, "", origin);
    if (std::find(kSections.begin(), kSections.end(), name) == kSections.end())
      throw ConfigError(location(section.first.Mark(), origin) + "unknown section '" + name + "'" + suggestion(name, kSections));
    if (section.second.IsNull()) continue;
    if (!section.second.IsMap())
      throw ConfigError(location(section.second.Mark(), origin) + name + ": expected a map of fields");
    std::vector<std::string> keys_seen;
    // The seed's list form of partition and partition_layers name the same thing: both in one file
    // is a contradiction (whichever came last won), as partition_file with partition_layers is.
    if (name == "parallel" && section.second["partition"] && section.second["partition"].IsSequence() &&
        section.second["partition_layers"]) {
      throw ConfigError(location(section.second["partition_layers"].Mark(), origin) +
                        "parallel.partition (a list) and parallel.partition_layers both give the partition; keep one");
    }
    for (const auto& entry : section.second) {
      const std::string key = key_text(entry.first, keys_seen, name + ".", origin);
      const Field* f = find_field(name, key);
      if (!f) throw ConfigError(location(entry.first.Mark(), origin) + unknown_field_message(name, key));
      read_field(c, *f, entry.second, origin);
    }
  }
  return c;  // cross-field rules wait for validate(): later overrides may still fix them
}

PipelineConfig PipelineConfig::from_yaml_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw ConfigError("config file '" + path + "' is a folder: give a YAML file (--config; configs/ has examples)");
  }
  std::ifstream in(path);
  if (!in)
    throw ConfigError("cannot read config file '" + path + "': " + std::strerror(errno) +
                      " (check the --config path; configs/ has examples)");
  std::stringstream text;
  text << in.rdbuf();
  // A file that names no section would train on built-in defaults: almost surely the wrong file
  // (or an unsaved one). A string (tests, --set) may still be empty.
  const YAML::Node root = parse_yaml(text.str(), path);
  if (root.IsNull() || (root.IsMap() && root.size() == 0))
    throw ConfigError("config file '" + path + "' is empty: it names none of the sections model, dataset, "
                      "training, parallel (give at least one, e.g. 'training:\n  max_steps: 10'; configs/ has examples)");
  return from_yaml_string(text.str(), path);
}

void PipelineConfig::apply_override(const std::string& assignment) {
  const std::string origin = "override '" + assignment + "'";
  const size_t eq = assignment.find('=');
  const size_t dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw ConfigError(origin + ": expected section.field=value, e.g. training.learning_rate=3e-4");
  const std::string section = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string value = assignment.substr(eq + 1);
  if (std::find(kSections.begin(), kSections.end(), section) == kSections.end())
    throw ConfigError(origin + ": unknown section '" + section + "'" + suggestion(section, kSections));
  const Field* f = find_field(section, key);
  if (!f) throw ConfigError(origin + ": " + unknown_field_message(section, key));
  // Strings are taken verbatim (a path may contain ':' or '#'); everything else is YAML, so
  // lists are written "[12,13,13,11]".
  const bool list_value = f->takes_list && !value.empty() && value.front() == '[';
  const YAML::Node node = f->is_string && !list_value ? YAML::Node(value) : parse_yaml(value, origin);
  if (!f->is_string && node.IsNull()) throw ConfigError(origin + ": " + f->path() + " needs a value (" + f->type + ")");
  read_field(*this, *f, node, origin, /*has_lines=*/false);
}

void PipelineConfig::load_partition_file() {
  ParallelConfig& par = parallel;
  if (par.partition_file.empty()) return;
  const std::string& path = par.partition_file;
  std::ifstream in(path);
  if (!in)
    throw ConfigError("parallel.partition_file '" + path + "': cannot read it: " + std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError("parallel.partition_file '" + path + "': not valid JSON: " + e.what());
  }
  const std::string expected = R"(expected {"partition": [12, 13, 13, 11], "recompute_ratio": [0.3, 0, 0, 0]} )"
                               "(recompute_ratio optional)";
  if (!j.is_object() || !j.contains("partition") || !j["partition"].is_array())
    throw ConfigError("parallel.partition_file '" + path + "': no \"partition\" list; " + expected);
  for (const auto& item : j.items()) {
    if (item.key() != "partition" && item.key() != "recompute_ratio")
      throw ConfigError("parallel.partition_file '" + path + "': unknown key \"" + item.key() + "\"; " + expected);
  }
  if (j["partition"].empty()) throw ConfigError("parallel.partition_file '" + path + "': the \"partition\" list is empty; " + expected);
  std::vector<int64_t> layers;
  for (const auto& v : j["partition"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      throw ConfigError("parallel.partition_file '" + path + "': \"partition\" holds " + v.dump() +
                        "; each entry is a stage's layer count, an integer >= 1");
    layers.push_back(v.get<int64_t>());
  }
  std::vector<double> ratios;
  if (j.contains("recompute_ratio")) {
    if (!j["recompute_ratio"].is_array())
      throw ConfigError("parallel.partition_file '" + path + "': \"recompute_ratio\" is not a list; " + expected);
    for (const auto& v : j["recompute_ratio"]) {
      if (!v.is_number() || v.get<double>() < 0 || v.get<double>() > 1)
        throw ConfigError("parallel.partition_file '" + path + "': \"recompute_ratio\" holds " + v.dump() +
                          "; each entry is a share of the stage's layers, in [0, 1]");
      ratios.push_back(v.get<double>());
    }
  }
  if (!par.partition_layers.empty())
    throw ConfigError("parallel.partition_file '" + path + "' and parallel.partition_layers both give the partition; "
                      "keep one");
  // A method asked for as well (--partition time) used to lose to the file without a word.
  if (par.partition != "uniform" && par.partition != "explicit")
    throw ConfigError("parallel.partition_file '" + path + "' gives the partition and parallel.partition is " +
                      par.partition + "; keep one");
  if (!ratios.empty() && !par.recompute_ratio.empty())
    throw ConfigError("parallel.partition_file '" + path + "' and parallel.recompute_ratio both give the recompute "
                      "ratios; keep one");
  par.partition = "explicit";
  par.partition_layers = std::move(layers);
  if (!ratios.empty()) par.recompute_ratio = std::move(ratios);
  par.partition_file.clear();  // folded in: the config now says it all (print-config, checkpoints)
}

void PipelineConfig::validate() const {
  for (const Field& f : field_table())
    if (std::string p = f.problem(*this); !p.empty()) throw ConfigError(f.path() + ": " + p);
  detail::check_cross_fields(*this);
}

TrainingConfig replica_training(const ParallelConfig& parallel, const TrainingConfig& training) {
  TrainingConfig replica = training;
  replica.num_microbatches /= std::max(1, parallel.data_parallel_size);
  return replica;
}

PipelineConfig replica_config(const PipelineConfig& config) {
  PipelineConfig replica = config;
  replica.training = replica_training(config.parallel, config.training);
  return replica;
}

std::string run_fingerprint_text(const PipelineConfig& config) {
  std::string text = config.to_yaml();
  for (const auto& [field, path] : {std::pair<const char*, const std::string&>{"parallel.schedule_file", config.parallel.schedule_file},
                                    {"dataset.tokenizer_model", config.dataset.tokenizer_model}}) {
    if (path.empty()) continue;
    std::ifstream in(path, std::ios::binary);
    text += std::string("\n# ") + field + " (" + path + ") contents\n";
    if (in) text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

std::vector<std::string> config_differences(const PipelineConfig& a, const PipelineConfig& b) {
  auto value = [](const Field& f, const PipelineConfig& c) {
    YAML::Emitter out;
    out << YAML::Flow;
    f.write(out, c);
    return std::string(out.c_str());
  };
  std::vector<std::string> out;
  for (const std::string& section : kSections) {
    for (const Field& f : field_table()) {
      if (f.section != section) continue;
      const std::string va = value(f, a), vb = value(f, b);
      if (va != vb) out.push_back(f.path() + ": " + va + " vs " + vb);
    }
  }
  return out;
}

std::string PipelineConfig::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const std::string& section : kSections) {
    // Only the synthetic model reads its section: other configs stay as they were written.
    if (section == "synthetic" && model.name != "synthetic") continue;
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const Field& f : field_table()) {
      if (f.section != section) continue;
      out << YAML::Key << f.key << YAML::Value;
      f.write(out, *this);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace gpipe
