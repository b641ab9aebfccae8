// Payloads of intercepted calls: what the real-driver backend needs to make the call later.
// A payload built in a wrapper borrows the caller's arguments; clone() makes an owned deep copy
// for a deferred op (or returns nullptr when it cannot, and the caller then waits).
#pragma once

#include <memory>
#include <tuple>
#include <vector>

#include "cuda_api.h"
#include "scheduler/op.h"

namespace orion {

// Makes `ctx` the calling thread's current context for the guard's lifetime when it is not
// already (null: leaves the thread alone), and restores the thread's own context afterwards: a
// deferred op runs under its caller's context whichever thread submits it, and that thread keeps
// its own.
class ContextGuard {
 public:
  explicit ContextGuard(CUcontext ctx);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  CUresult status() const { return status_; }

 private:
  bool pushed_ = false;
  CUresult status_ = CUDA_SUCCESS;
};

class DriverCall : public sched::OpPayload {
 public:
  explicit DriverCall(CUstream stream) : stream_(stream) {}
  // Makes the real driver call, under the context the payload recorded (if any); the backend
  // wraps it in a ContextGuard for context() (see driver_device.cpp).
  CUresult call() const { return invoke(); }
  CUstream stream() const { return stream_; }
  CUcontext context() const { return context_; }
  // Records the calling thread's current context (done for every payload that may be submitted
  // from another thread: clones, and calls the caller waits for).
  void capture_context();

 protected:
  virtual CUresult invoke() const = 0;

 private:
  CUstream stream_;
  CUcontext context_ = nullptr;
};

// Any driver call whose arguments are plain values (handles, sizes, device pointers): copying
// the arguments is a deep copy.
template <typename Fn, typename... Args>
class ValueCall final : public DriverCall {
 public:
  ValueCall(CUstream stream, Fn fn, Args... args) : DriverCall(stream), fn_(fn), args_(args...) {}
  static std::unique_ptr<sched::OpPayload> clone(const sched::OpPayload& p) {
    auto copy = std::make_unique<ValueCall>(static_cast<const ValueCall&>(p));
    copy->capture_context();
    return copy;
  }

 protected:
  CUresult invoke() const override { return std::apply(fn_, args_); }

 private:
  Fn fn_;
  std::tuple<Args...> args_;
};

template <typename Fn, typename... Args>
ValueCall<Fn, Args...> value_call(CUstream stream, Fn fn, Args... args) {
  return ValueCall<Fn, Args...>(stream, fn, args...);
}

// One kernel launch through any launch entry point. Borrowed: points at the caller's
// kernelParams / extra / config. Cloned: owns copies of all three.
class KernelLaunch final : public DriverCall {
 public:
  enum class Api { kLaunch, kLaunchPtsz, kCooperative, kCooperativePtsz, kEx, kExPtsz };

  // cuLaunchKernel / cuLaunchCooperativeKernel (+ _ptsz).
  KernelLaunch(Api api, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
               unsigned by, unsigned bz, unsigned smem, CUstream stream, void** params,
               void** extra);
  // cuLaunchKernelEx (+ _ptsz).
  KernelLaunch(Api api, const CUlaunchConfig* config, CUfunction f, void** params, void** extra);

  static std::unique_ptr<sched::OpPayload> clone(const sched::OpPayload& p);

  CUfunction function() const { return f_; }
  const CUlaunchConfig& config() const { return config_; }
  bool cooperative() const { return api_ == Api::kCooperative || api_ == Api::kCooperativePtsz; }
  // The same launch on another stream (the partition policy's green-context shadow stream); the
  // caller makes the stream's context current.
  CUresult call_on(CUstream stream) const;
  // Launched in the remote memory-synchronisation domain (CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN):
  // what NCCL does for its kernels, so communication whatever the kernel's name.
  bool remote_sync_domain() const;
  // The event the launch records itself (CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT or
  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT), or null. One per launch is tracked (the first).
  CUevent recorded_event() const;
  // How many events the launch records (a launch-completion and a programmatic event: 2).
  int recorded_event_count() const;

 protected:
  CUresult invoke() const override;

 private:
  bool deep_copy_from(const KernelLaunch& src);
  CUresult invoke_with(const CUlaunchConfig& c) const;

  Api api_;
  CUfunction f_;
  CUlaunchConfig config_{};  // grid, block, smem, stream (+ attrs for Ex)
  void** params_;
  void** extra_;
  // Owned storage of a clone.
  std::vector<CUlaunchAttribute> attrs_;
  std::vector<unsigned char> param_bytes_;
  std::vector<void*> param_ptrs_;
  std::vector<unsigned char> extra_bytes_;
  size_t extra_size_ = 0;
  std::vector<void*> extra_array_;
};

}  // namespace orion
