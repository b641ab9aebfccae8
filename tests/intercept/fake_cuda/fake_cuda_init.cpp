// The fake driver's initialisation, version and error names, and the faults its cuInit can be
// told to make (FAKE_CUDA_INIT_FAULT) for the tests of programs that must survive a misbehaving
// driver (driver_model_check's probes).
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// FAKE_CUDA_INIT_FAULT makes cuInit misbehave, for driver_model_check's tests of a probe that
// crashes (crash), hangs (hang), or leaves a process behind holding the probe's descriptors, as a
// driver helper might (spawn: a forked process that sleeps 60 s; its pid is written to the file
// FAKE_CUDA_INIT_FAULT_FILE names).
FAKE_EXPORT CUresult CUDAAPI cuInit(unsigned int) {
  const char* fault = std::getenv("FAKE_CUDA_INIT_FAULT");
  if (fault == nullptr) return CUDA_SUCCESS;
  if (std::strcmp(fault, "crash") == 0) std::raise(SIGSEGV);
  if (std::strcmp(fault, "hang") == 0) {
    for (;;) pause();
  }
  if (std::strcmp(fault, "spawn") == 0) {
    const pid_t child = fork();
    if (child == 0) {
      sleep(60);
      _exit(0);
    }
    if (const char* file = std::getenv("FAKE_CUDA_INIT_FAULT_FILE"); file != nullptr && child > 0) {
      if (FILE* f = std::fopen(file, "w")) {
        std::fprintf(f, "%d\n", static_cast<int>(child));
        std::fclose(f);
      }
    }
  }
  return CUDA_SUCCESS;
}
// The names of the results the fake gives (the real driver knows every CUresult; an unknown one
// is CUDA_ERROR_INVALID_VALUE with *name set to NULL, as there).
FAKE_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define FAKE_CUDA_RESULT_NAME(r) \
  case r:                        \
    *name = #r;                  \
    return CUDA_SUCCESS;
    FAKE_CUDA_RESULT_NAME(CUDA_SUCCESS)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_INVALID_VALUE)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_NOT_INITIALIZED)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_INVALID_DEVICE)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_INVALID_CONTEXT)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_INVALID_HANDLE)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_INVALID_RESOURCE_TYPE)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_NOT_FOUND)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_INVALID_IMAGE)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_INVALID_PTX)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_NOT_READY)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_ILLEGAL_STATE)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_NOT_SUPPORTED)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    FAKE_CUDA_RESULT_NAME(CUDA_ERROR_UNKNOWN)
#undef FAKE_CUDA_RESULT_NAME
    default:
      *name = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}
FAKE_EXPORT CUresult CUDAAPI cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
