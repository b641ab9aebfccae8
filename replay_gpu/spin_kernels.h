// The embedded fatbin of spin_kernels.cu (generated at build time by embed_file.cmake) and the
// names of its kernels.
#pragma once

#include <cstddef>
#include <string>

namespace replay_gpu {

// Copies of the spin kernel (ORION_REPLAY_SLOTS in spin_kernels.cu): each distinct kernel name of
// a workload gets one, in order of first appearance (wrapping round past this many).
inline constexpr int kSpinKernelSlots = 128;

inline std::string spin_kernel_name(int slot) { return "orion_replay_spin_" + std::to_string(slot); }

// The fatbin's bytes (sm_90 code + PTX), for cuLibraryLoadData.
extern const unsigned char kSpinKernelsFatbin[];
extern const size_t kSpinKernelsFatbinSize;

}  // namespace replay_gpu
