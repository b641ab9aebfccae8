// The CUDA driver API as the shim sees it. Defining __CUDA_API_VERSION_INTERNAL (what the driver
// itself does) makes cuda.h declare every ABI variant under its own name (cuMemFree_v2,
// cuLaunchKernel_ptsz, ...) instead of remapping names with macros, so the shim can define each
// exported symbol exactly once and compare its type with cudaTypedefs.h. The driver's profiler
// and graphics-interop functions are part of it (libcuda exports them; gen_driver_api.py's
// DRIVER_HEADERS): their headers need the windowing systems' own types first.
#pragma once

#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cudaProfiler.h>
#include <cudaProfilerTypedefs.h>
#include <GL/gl.h>
#include <cudaGL.h>
#include <cudaGLTypedefs.h>
#include <EGL/egl.h>
#include <cudaEGL.h>
#include <cudaEGLTypedefs.h>
#include <vdpau/vdpau.h>
#include <cudaVDPAU.h>
#include <cudaVDPAUTypedefs.h>
