// Orion's kernel profile CSV (`Name,Profile,Memory_footprint,SM_usage,Duration`): parsing with
// errors that name the line and field, and writing. Internal to the scheduler library.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

#include "scheduler/op.h"

namespace sched::detail {

struct ProfileRow {
  std::string name;
  KernelProfile profile = KernelProfile::kUnknown;
  uint64_t memory_footprint = 0;
  int sm_usage = 0;
  double duration_ns = 0;
};

inline constexpr const char* kOrionCsvHeader = "Name,Profile,Memory_footprint,SM_usage,Duration";

// Throws std::invalid_argument "<source>:<line>: field '<Field>': <problem>".
std::vector<ProfileRow> parse_orion_csv(std::istream& in, const std::string& source_name);
void write_orion_csv(std::ostream& out, const std::vector<ProfileRow>& rows);

// Opens `path` for reading (throws std::invalid_argument naming the path) and runs `read`.
template <typename Read>
auto with_input_file(const std::string& path, Read&& read) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot open profile CSV '" + path + "' for reading");
  return read(in);
}

// Writes `path` through `write`; returns "" or an error naming the path.
std::string with_output_file(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace sched::detail
