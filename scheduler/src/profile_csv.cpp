#include "profile_csv.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <istream>
#include <ostream>

namespace sched::detail {

namespace {

std::string trim(std::string s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

[[noreturn]] void fail(const std::string& source, size_t line, const std::string& field,
                       const std::string& what) {
  throw std::invalid_argument(source + ":" + std::to_string(line) + ": field '" + field + "': " + what);
}

// Splits a row into its 5 fields. Kernel names often contain commas (template arguments), so the
// name is either quoted ("..." with "" escapes) or everything before the last four commas.
std::vector<std::string> split_row(const std::string& row, const std::string& source, size_t line) {
  std::vector<std::string> fields;
  std::string rest;
  if (!row.empty() && row.front() == '"') {
    std::string name;
    size_t i = 1;
    for (;; ++i) {
      if (i >= row.size()) fail(source, line, "Name", "unterminated quoted name");
      if (row[i] == '"') {
        if (i + 1 < row.size() && row[i + 1] == '"') {
          name += '"';
          ++i;
          continue;
        }
        break;
      }
      name += row[i];
    }
    if (i + 1 >= row.size() || row[i + 1] != ',') {
      fail(source, line, "Name", "expected ',' after the quoted name");
    }
    fields.push_back(name);
    rest = row.substr(i + 2);
    size_t start = 0;
    for (size_t pos; (pos = rest.find(',', start)) != std::string::npos; start = pos + 1) {
      fields.push_back(trim(rest.substr(start, pos - start)));
    }
    fields.push_back(trim(rest.substr(start)));
  } else {
    std::vector<size_t> commas;
    for (size_t i = 0; i < row.size(); ++i) {
      if (row[i] == ',') commas.push_back(i);
    }
    if (commas.size() < 4) {
      fail(source, line, "Name", "expected 5 comma-separated fields (" + std::string(kOrionCsvHeader) +
                                     "), found " + std::to_string(commas.size() + 1));
    }
    const size_t first = commas[commas.size() - 4];
    fields.push_back(trim(row.substr(0, first)));
    size_t start = first + 1;
    for (size_t k = commas.size() - 3; k < commas.size(); ++k) {
      fields.push_back(trim(row.substr(start, commas[k] - start)));
      start = commas[k] + 1;
    }
    fields.push_back(trim(row.substr(start)));
  }
  if (fields.size() != 5) {
    fail(source, line, "Duration", "expected 5 fields (" + std::string(kOrionCsvHeader) + "), found " +
                                       std::to_string(fields.size()));
  }
  return fields;
}

// A field's figure in [0, max]. strtod takes "inf" and "1e300": an infinite duration counted as
// outstanding best-effort work zeroed the others' at its completion (inf - inf), and converting
// such a figure to an integer is undefined behaviour.
double parse_number(const std::string& text, const std::string& source, size_t line, const std::string& field,
                    double max) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || v != v) {
    fail(source, line, field, "expected a number, got '" + text + "'");
  }
  if (!std::isfinite(v)) fail(source, line, field, "expected a finite number, got '" + text + "'");
  if (v < 0) fail(source, line, field, "must not be negative, got '" + text + "'");
  if (v > max) {
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g", max);
    fail(source, line, field, std::string("must be at most ") + limit + ", got '" + text + "'");
  }
  return v;
}
// The largest figures taken: 2^53 bytes (exact in a double), SMs of any GPU, an hour in ns.
constexpr double kMaxFootprintBytes = 9007199254740992.0;
constexpr double kMaxSms = 100000;
constexpr double kMaxDurationNs = 3.6e12;

std::string quote_if_needed(const std::string& name) {
  if (name.find_first_of(",\"") == std::string::npos && !name.empty()) return name;
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::vector<ProfileRow> parse_orion_csv(std::istream& in, const std::string& source) {
  std::vector<ProfileRow> rows;
  std::string raw;
  size_t line = 0;
  bool header_seen = false;
  while (std::getline(in, raw)) {
    ++line;
    std::string row = trim(raw);
    if (line == 1 && row.rfind("\xEF\xBB\xBF", 0) == 0) row = row.substr(3);  // UTF-8 BOM
    if (row.empty()) continue;
    if (!header_seen) {
      std::string compact;
      for (char c : row) {
        if (c != ' ') compact += c;
      }
      if (compact != kOrionCsvHeader) {
        throw std::invalid_argument(source + ":" + std::to_string(line) + ": expected the header '" +
                                    kOrionCsvHeader + "', got '" + row + "'");
      }
      header_seen = true;
      continue;
    }
    const std::vector<std::string> f = split_row(row, source, line);
    ProfileRow r;
    r.name = f[0];
    if (r.name.empty()) fail(source, line, "Name", "empty kernel name");
    if (f[1] == "1") {
      r.profile = KernelProfile::kComputeBound;
    } else if (f[1] == "0") {
      r.profile = KernelProfile::kMemoryBound;
    } else if (f[1] == "-1") {
      r.profile = KernelProfile::kUnknown;
    } else {
      fail(source, line, "Profile", "expected 1 (compute), 0 (memory) or -1 (unknown), got '" + f[1] + "'");
    }
    r.memory_footprint = static_cast<uint64_t>(parse_number(f[2], source, line, "Memory_footprint", kMaxFootprintBytes));
    const double sm = parse_number(f[3], source, line, "SM_usage", kMaxSms);
    if (sm != static_cast<double>(static_cast<int>(sm))) {
      fail(source, line, "SM_usage", "expected a whole number of SMs, got '" + f[3] + "'");
    }
    r.sm_usage = static_cast<int>(sm);
    r.duration_ns = parse_number(f[4], source, line, "Duration", kMaxDurationNs);
    rows.push_back(std::move(r));
  }
  if (in.bad()) throw std::invalid_argument(source + ": read error after line " + std::to_string(line));
  if (!header_seen) {
    throw std::invalid_argument(source + ": empty profile CSV (expected the header '" +
                                std::string(kOrionCsvHeader) + "')");
  }
  return rows;
}

void write_orion_csv(std::ostream& out, const std::vector<ProfileRow>& rows) {
  out << kOrionCsvHeader << '\n';
  for (const ProfileRow& r : rows) {
    char duration[64];
    auto res = std::to_chars(duration, duration + sizeof(duration), r.duration_ns);
    out << quote_if_needed(r.name) << ',' << static_cast<int>(r.profile) << ',' << r.memory_footprint
        << ',' << r.sm_usage << ',' << std::string(duration, res.ptr) << '\n';
  }
}

std::string with_output_file(const std::string& path, const std::function<void(std::ostream&)>& write) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return "cannot open '" + path + "' for writing: " + std::strerror(errno);
  write(out);
  out.flush();
  if (!out) return "error writing '" + path + "': " + std::strerror(errno);
  return "";
}

}  // namespace sched::detail
