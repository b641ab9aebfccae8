// The replayer's synthetic kernels: every block busy-waits a given time, so a launch with the
// workload's grid, block and dynamic shared memory holds the GPU as the workload's kernel would
// (the simulator's model: a kernel is its blocks, each taking the op's block time). Compiled at
// build time to a fatbin (sm_90 code plus PTX) that the replayer embeds and loads as
// context-independent CUkernels (cuLibraryLoadData): the shim's partition policy can move only
// those onto green-context streams.
//
// kSpinKernelSlots copies of one kernel under different names: the shim learns kernel durations
// per kernel (its identity is the CUkernel), so each workload kernel name gets its own copy.

// Keep in sync with kSpinKernelSlots in spin_kernels.h.
#define ORION_REPLAY_SLOTS 128

__device__ __forceinline__ unsigned long long replay_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// block_ns: how long each block runs. use_clock: 0 waits on %globaltimer (ns, wall clock), 1 on
// clock64 with cycles_per_ns (the SM clock: exact while the clock holds). smem_bytes: the dynamic
// shared memory the launch asked for, written once so it is really allocated and touched. sink:
// written only if a value read back is impossible, so the compiler keeps the shared-memory work.
__device__ __forceinline__ void replay_spin(unsigned long long block_ns, unsigned int smem_bytes,
                                            unsigned int use_clock, float cycles_per_ns,
                                            unsigned long long* sink) {
  extern __shared__ unsigned int replay_smem[];
  const unsigned int threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned int words = smem_bytes / 4u;
  for (unsigned int i = tid; i < words; i += threads) replay_smem[i] = i ^ blockIdx.x;
  __syncthreads();
  if (use_clock != 0) {
    const long long cycles = static_cast<long long>(static_cast<double>(block_ns) * cycles_per_ns);
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
  } else {
    const unsigned long long start = replay_globaltimer();
    while (replay_globaltimer() - start < block_ns) {
    }
  }
  if (words > 0 && sink != nullptr) {
    const unsigned int i = tid % words;
    if (replay_smem[i] != (i ^ blockIdx.x)) *sink = replay_smem[i];
  }
}

#define ORION_REPLAY_KERNEL(n)                                                                        \
  extern "C" __global__ void orion_replay_spin_##n(unsigned long long block_ns, unsigned int smem_bytes, \
                                                   unsigned int use_clock, float cycles_per_ns,          \
                                                   unsigned long long* sink) {                          \
    replay_spin(block_ns, smem_bytes, use_clock, cycles_per_ns, sink);                                  \
  }
// Ten kernels whose names end in <tens>0 ... <tens>9 (tens empty: 0 ... 9).
#define ORION_REPLAY_KERNELS_10(tens)                                                                       \
  ORION_REPLAY_KERNEL(tens##0) ORION_REPLAY_KERNEL(tens##1) ORION_REPLAY_KERNEL(tens##2)                    \
  ORION_REPLAY_KERNEL(tens##3) ORION_REPLAY_KERNEL(tens##4) ORION_REPLAY_KERNEL(tens##5)                    \
  ORION_REPLAY_KERNEL(tens##6) ORION_REPLAY_KERNEL(tens##7) ORION_REPLAY_KERNEL(tens##8)                    \
  ORION_REPLAY_KERNEL(tens##9)

// orion_replay_spin_0 ... orion_replay_spin_127 (ORION_REPLAY_SLOTS).
ORION_REPLAY_KERNELS_10()
ORION_REPLAY_KERNELS_10(1)
ORION_REPLAY_KERNELS_10(2)
ORION_REPLAY_KERNELS_10(3)
ORION_REPLAY_KERNELS_10(4)
ORION_REPLAY_KERNELS_10(5)
ORION_REPLAY_KERNELS_10(6)
ORION_REPLAY_KERNELS_10(7)
ORION_REPLAY_KERNELS_10(8)
ORION_REPLAY_KERNELS_10(9)
ORION_REPLAY_KERNELS_10(10)
ORION_REPLAY_KERNELS_10(11)
ORION_REPLAY_KERNEL(120) ORION_REPLAY_KERNEL(121) ORION_REPLAY_KERNEL(122) ORION_REPLAY_KERNEL(123)
ORION_REPLAY_KERNEL(124) ORION_REPLAY_KERNEL(125) ORION_REPLAY_KERNEL(126) ORION_REPLAY_KERNEL(127)
