#include "trainer/model/attention_backend.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <string>

#include "trainer/config/config.h"

namespace gpipe {
namespace {

// ATen reports why a kernel cannot run as warnings while it chooses; collect them for the error.
// Some of them are TORCH_WARN_ONCE (once per process): a second refusal in one process may carry
// fewer reasons, which the runner never meets (it asks once, before the first step).
class CollectedWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    // ATen says "Flash attention kernel not used because:" and then one warning per reason.
    text += (text.empty() ? "" : text.back() == ':' ? " " : "; ") + warning.msg();
  }
  std::string text;
};

std::string backend_name(int64_t choice) {
  switch (static_cast<at::SDPBackend>(choice)) {
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::flash_attention: return "flash";
    case at::SDPBackend::efficient_attention: return "efficient";
    case at::SDPBackend::cudnn_attention: return "cudnn";
    case at::SDPBackend::overrideable: return "overrideable";
    case at::SDPBackend::error: break;
  }
  return fmt::format("unknown ({})", choice);
}

std::string describe(const AttentionShape& s) {
  return fmt::format("{} heads x {} positions x head dim {}{}", s.num_heads, s.sequence_length, s.head_dim,
                     s.causal ? ", causal" : "");
}

}  // namespace

void use_attention_backend(const std::string& setting) {
  const bool all = setting == "auto";
  if (!all && setting != "flash" && setting != "efficient" && setting != "cudnn" && setting != "math") {
    throw ConfigError("model.attention='" + setting + "' is not one of auto, flash, efficient, cudnn, math");
  }
  // "auto" is PyTorch's default set (FA3 stays off, as in PyTorch); a name is that kernel alone.
  auto& ctx = at::globalContext();
  ctx.setSDPUseFlash(all || setting == "flash");
  ctx.setSDPUseMemEfficient(all || setting == "efficient");
  ctx.setSDPUseCuDNN(all || setting == "cudnn");
  ctx.setSDPUseMath(all || setting == "math");
}

std::string chosen_attention_backend(const std::string& setting, const AttentionShape& shape, c10::Device device,
                                     at::ScalarType dtype) {
  if (device.is_cpu() && (setting == "efficient" || setting == "cudnn")) {
    throw ConfigError("model.attention=" + setting + " is a CUDA kernel and this run is on the CPU: use auto, flash or math");
  }
  // ATen's hardware checks read the current device's properties, not the tensors'.
  c10::OptionalDeviceGuard device_guard;
  if (!device.is_cpu()) device_guard.reset_device(device);
  const auto options = at::TensorOptions().device(device).dtype(dtype);
  // One sample is enough: the kernels' constraints are on heads, length, head size, dtype,
  // causality, dropout and gradients, not on the batch.
  auto make = [&] { return at::empty({1, shape.num_heads, shape.sequence_length, shape.head_dim}, options).requires_grad_(true); };
  const at::Tensor q = make(), k = make(), v = make();
  CollectedWarnings reasons;
  try {
    const c10::WarningUtils::WarningHandlerGuard guard(&reasons);
    return backend_name(at::_fused_sdp_choice(q, k, v, std::nullopt, shape.dropout, shape.causal));
  } catch (const c10::Error& e) {
    throw ConfigError(fmt::format(
        "model.attention={} cannot run this model's attention ({}) on {} in {}: {}{}. Use model.attention=auto "
        "(PyTorch's own choice) or another kernel (flash, efficient, cudnn, math)",
        setting, describe(shape), device.str(), c10::toString(dtype), e.what_without_backtrace(),
        reasons.text.empty() ? "" : " (" + reasons.text + ")"));
  }
}

std::string select_attention_backend(const std::string& setting, const AttentionShape& shape, c10::Device device,
                                     at::ScalarType dtype) {
  auto& ctx = at::globalContext();
  const bool flash = ctx.userEnabledFlashSDP(), efficient = ctx.userEnabledMemEfficientSDP(),
             cudnn = ctx.userEnabledCuDNNSDP(), math = ctx.userEnabledMathSDP();
  use_attention_backend(setting);
  try {
    return chosen_attention_backend(setting, shape, device, dtype);
  } catch (...) {
    // Refused: the switches go back to what they were, not left on a kernel that cannot run.
    ctx.setSDPUseFlash(flash);
    ctx.setSDPUseMemEfficient(efficient);
    ctx.setSDPUseCuDNN(cudnn);
    ctx.setSDPUseMath(math);
    throw;
  }
}

}  // namespace gpipe
