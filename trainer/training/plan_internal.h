// Small helpers shared by the two halves of --plan (plan_measure.cpp, plan_command.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace gpipe::plan_detail {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

inline double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace gpipe::plan_detail
