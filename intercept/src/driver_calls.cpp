#include "driver_calls.h"

#include <cstring>

#include "kernel_catalog.h"
#include "real_driver.h"

namespace orion {

ContextGuard::ContextGuard(CUcontext ctx) {
  if (ctx == nullptr || !real::cuCtxGetCurrent || !real::cuCtxPushCurrent_v2 ||
      !real::cuCtxPopCurrent_v2) {
    return;
  }
  CUcontext current = nullptr;
  if (real::cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx) return;
  status_ = real::cuCtxPushCurrent_v2(ctx);
  pushed_ = status_ == CUDA_SUCCESS;
}

ContextGuard::~ContextGuard() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  real::cuCtxPopCurrent_v2(&popped);
}

void DriverCall::capture_context() {
  CUcontext current = nullptr;
  if (real::cuCtxGetCurrent && real::cuCtxGetCurrent(&current) == CUDA_SUCCESS) context_ = current;
}

KernelLaunch::KernelLaunch(Api api, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                           unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream stream,
                           void** params, void** extra)
    : DriverCall(stream), api_(api), f_(f), params_(params), extra_(extra) {
  config_.gridDimX = gx;
  config_.gridDimY = gy;
  config_.gridDimZ = gz;
  config_.blockDimX = bx;
  config_.blockDimY = by;
  config_.blockDimZ = bz;
  config_.sharedMemBytes = smem;
  config_.hStream = stream;
}

KernelLaunch::KernelLaunch(Api api, const CUlaunchConfig* config, CUfunction f, void** params,
                           void** extra)
    : DriverCall(config->hStream), api_(api), f_(f), config_(*config), params_(params),
      extra_(extra) {}

CUresult KernelLaunch::invoke() const { return invoke_with(config_); }

CUresult KernelLaunch::call_on(CUstream stream) const {
  CUlaunchConfig c = config_;
  c.hStream = stream;
  return invoke_with(c);
}

CUresult KernelLaunch::invoke_with(const CUlaunchConfig& c) const {
  switch (api_) {
    case Api::kLaunch:
      return real::cuLaunchKernel(f_, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY,
                                  c.blockDimZ, c.sharedMemBytes, c.hStream, params_, extra_);
    case Api::kLaunchPtsz:
      return real::cuLaunchKernel_ptsz(f_, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX,
                                       c.blockDimY, c.blockDimZ, c.sharedMemBytes, c.hStream,
                                       params_, extra_);
    case Api::kCooperative:
      return real::cuLaunchCooperativeKernel(f_, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX,
                                             c.blockDimY, c.blockDimZ, c.sharedMemBytes,
                                             c.hStream, params_);
    case Api::kCooperativePtsz:
      return real::cuLaunchCooperativeKernel_ptsz(f_, c.gridDimX, c.gridDimY, c.gridDimZ,
                                                  c.blockDimX, c.blockDimY, c.blockDimZ,
                                                  c.sharedMemBytes, c.hStream, params_);
    case Api::kEx:
      return real::cuLaunchKernelEx(&c, f_, params_, extra_);
    case Api::kExPtsz:
      return real::cuLaunchKernelEx_ptsz(&c, f_, params_, extra_);
  }
  return CUDA_ERROR_INVALID_VALUE;
}

bool KernelLaunch::remote_sync_domain() const {
  for (unsigned i = 0; config_.attrs != nullptr && i < config_.numAttrs; ++i) {
    if (config_.attrs[i].id == CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN &&
        config_.attrs[i].value.memSyncDomain == CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE) {
      return true;
    }
  }
  return false;
}

CUevent KernelLaunch::recorded_event() const {
  for (unsigned i = 0; config_.attrs != nullptr && i < config_.numAttrs; ++i) {
    const CUlaunchAttribute& a = config_.attrs[i];
    if (a.id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) return a.value.launchCompletionEvent.event;
    if (a.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT) return a.value.programmaticEvent.event;
  }
  return nullptr;
}

int KernelLaunch::recorded_event_count() const {
  int n = 0;
  for (unsigned i = 0; config_.attrs != nullptr && i < config_.numAttrs; ++i) {
    const CUlaunchAttribute& a = config_.attrs[i];
    n += (a.id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT && a.value.launchCompletionEvent.event != nullptr) ||
         (a.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT && a.value.programmaticEvent.event != nullptr);
  }
  return n;
}

std::unique_ptr<sched::OpPayload> KernelLaunch::clone(const sched::OpPayload& p) {
  const auto& src = static_cast<const KernelLaunch&>(p);
  std::unique_ptr<KernelLaunch> copy(new KernelLaunch(src.api_, src.f_, 1, 1, 1, 1, 1, 1, 0,
                                                      src.stream(), nullptr, nullptr));
  if (!copy->deep_copy_from(src)) return nullptr;
  copy->capture_context();
  return copy;
}

bool KernelLaunch::deep_copy_from(const KernelLaunch& src) {
  config_ = src.config_;
  if (src.config_.numAttrs > 0 && src.config_.attrs != nullptr) {
    attrs_.assign(src.config_.attrs, src.config_.attrs + src.config_.numAttrs);
    config_.attrs = attrs_.data();
  }
  params_ = nullptr;
  extra_ = nullptr;
  if (src.params_ != nullptr) {
    // The sizes of the arguments come from the driver's parameter info; without it the
    // arguments cannot be copied and the caller must wait.
    const FunctionInfo& info = function_info(src.f_);
    if (!info.params_known) return false;
    param_bytes_.resize(info.param_bytes);
    param_ptrs_.resize(info.param_sizes.size());
    for (size_t i = 0; i < info.param_sizes.size(); ++i) {
      unsigned char* dst = param_bytes_.data() + info.param_offsets[i];
      std::memcpy(dst, src.params_[i], info.param_sizes[i]);
      param_ptrs_[i] = dst;
    }
    if (param_ptrs_.empty()) param_ptrs_.push_back(nullptr);  // a valid array even with no args
    params_ = param_ptrs_.data();
  }
  if (src.extra_ != nullptr) {
    // Only the documented packed-buffer form can be copied.
    const void* buffer = nullptr;
    const size_t* size = nullptr;
    for (void** e = src.extra_; *e != CU_LAUNCH_PARAM_END; e += 2) {
      if (e[0] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        buffer = e[1];
      } else if (e[0] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
        size = static_cast<const size_t*>(e[1]);
      } else {
        return false;
      }
    }
    if (buffer == nullptr || size == nullptr) return false;
    extra_size_ = *size;
    extra_bytes_.assign(static_cast<const unsigned char*>(buffer),
                        static_cast<const unsigned char*>(buffer) + extra_size_);
    extra_array_ = {CU_LAUNCH_PARAM_BUFFER_POINTER, extra_bytes_.data(),
                    CU_LAUNCH_PARAM_BUFFER_SIZE, &extra_size_, CU_LAUNCH_PARAM_END};
    extra_ = extra_array_.data();
  }
  return true;
}

}  // namespace orion
