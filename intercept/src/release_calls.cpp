// The release_all class: before a call that may observe or change work the shim holds back (a
// free, a context reset, a graph-executable edit, an attribute change, any function nobody
// classified), everything held reaches the driver. Safe for every call, at the price of the held
// work's scheduling; the counts say how often a program pays it.
#include <algorithm>
#include <atomic>
#include <vector>

#include "driver_functions.h"
#include "shim.h"

namespace orion {
namespace {
constexpr size_t kFunctions = static_cast<size_t>(DriverFunctionId::kCount);
std::atomic<uint64_t> g_release_calls[kFunctions];
std::atomic<uint64_t> g_released[kFunctions];
}  // namespace

namespace generated {

CUresult missing() {
  return load_real_driver() ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_SHARED_OBJECT_INIT_FAILED;
}

void release_held_work(DriverFunctionId id) {
  Shim* shim = active_shim();
  if (shim == nullptr) return;
  const auto i = static_cast<size_t>(id);
  g_release_calls[i].fetch_add(1, std::memory_order_relaxed);
  if (shim->dispatcher().queued_now() != 0) {
    g_released[i].fetch_add(1, std::memory_order_relaxed);
    shim->dispatcher().release_all();
  }
  // The call itself may put work on a program stream (cuLaunchGridAsync, cuMemMapArrayAsync,
  // cuCtxWaitEvent, ...): moved launches fork again after it.
  shim->work_outside_dispatcher();
}

ContextEnd::ContextEnd(CUcontext ends, CUdevice primary_of, bool primaries_may_end)
    : ends_(ends), primary_of_(primary_of), primaries_may_end_(primaries_may_end) {
  Shim* shim = active_shim();
  if (shim == nullptr) return;
  lifecycle_ = shim->lock_context_lifecycle();
  if (ends_ != nullptr || (primaries_may_end_ && shim->have_primary_contexts())) {
    polls_blocked_.emplace(shim->device().block_polls());
  }
}

ContextEnd ContextEnd::destroy(CUcontext ctx) { return ContextEnd(ctx, -1, false); }

ContextEnd ContextEnd::primary_reset(CUdevice dev) {
  Shim* shim = active_shim();
  return ContextEnd(shim != nullptr ? shim->primary_context(dev) : nullptr, dev, false);
}

ContextEnd ContextEnd::primary_release(CUdevice) { return ContextEnd(nullptr, -1, true); }

ContextEnd ContextEnd::green_destroy(CUgreenCtx green) {
  CUcontext ctx = nullptr;
  // The green context still lives: its CUcontext is asked before the destroy (an order-free read).
  if (active_shim() != nullptr && green != nullptr && real::cuCtxFromGreenCtx != nullptr &&
      real::cuCtxFromGreenCtx(&ctx, green) != CUDA_SUCCESS) {
    ctx = nullptr;
  }
  return ContextEnd(ctx, -1, true);
}

ContextEnd ContextEnd::unnamed() { return ContextEnd(nullptr, -1, false); }

void ContextEnd::ended() {
  // A forgotten function is catalogued again from the driver at its next launch: forgetting too
  // much (a primary-context release that was not the last) costs a lookup, never correctness.
  Shim* shim = active_shim();
  if (shim == nullptr) return;
  shim->forget_functions();
  if (!polls_blocked_) return;
  if (ends_ != nullptr && primary_of_ >= 0) {
    shim->primary_context_ended(primary_of_, ends_, /*reset=*/true, *polls_blocked_);
  } else if (ends_ != nullptr) {
    shim->context_destroyed(ends_, *polls_blocked_);
  }
  if (primaries_may_end_) shim->primary_contexts_maybe_ended(*polls_blocked_);
}

}  // namespace generated

ReleaseCallCounts release_call_counts() {
  ReleaseCallCounts out;
  for (size_t i = 0; i < kFunctions; ++i) {
    out.calls += g_release_calls[i].load(std::memory_order_relaxed);
    out.released += g_released[i].load(std::memory_order_relaxed);
  }
  return out;
}

std::string release_call_summary() {
  std::vector<std::pair<uint64_t, size_t>> calls;
  for (size_t i = 0; i < kFunctions; ++i) {
    if (uint64_t n = g_release_calls[i].load(std::memory_order_relaxed)) calls.emplace_back(n, i);
  }
  if (calls.empty()) return "";
  std::sort(calls.rbegin(), calls.rend());
  const ReleaseCallCounts total = release_call_counts();
  std::string out = std::to_string(total.calls) + " release-class driver calls (" +
                    std::to_string(total.released) + " found held work):";
  for (size_t k = 0; k < calls.size() && k < 6; ++k) {
    const size_t i = calls[k].second;
    out += " " + std::string(driver_functions()[i].entry.symbol) + " " +
           std::to_string(calls[k].first) + " (" +
           std::to_string(g_released[i].load(std::memory_order_relaxed)) + " released)";
    out += k + 1 < calls.size() && k < 5 ? "," : "";
  }
  return out;
}

}  // namespace orion
