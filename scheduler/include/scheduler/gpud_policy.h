// The gpud policy (ORION_POLICY=gpud, issue 25) over any source of the pipeline's window and this
// process's grant. The shim's reads the shared pages orion-gpud hands over (make_policy("gpud",
// {gpu=...})); the simulator's study (orion-sim colocate) gives it simulated pages on the virtual
// clock through this header, so both run the same admission (gpud::admit).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "gpud/gpud.h"
#include "scheduler/policy.h"

namespace sched {

struct GpudSource {
  std::function<int64_t()> now_ns;
  std::function<gpud::WindowView(int64_t now_ns)> window;
  std::function<gpud::GrantView(int64_t now_ns)> grant;
};

std::unique_ptr<Policy> make_gpud_policy(GpudSource source, const gpud::AdmissionConfig& config);

}  // namespace sched
