// GPU check of libgpu_scheduler.so: a best-effort stream kept busy with long kernels and a
// high-priority stream launching short ones. Verifies both results on the host and prints the
// high-priority kernel latency (launch -> completion, host clock). Run it on a GPU machine with
// and without the shim and compare:
//   gpu_hp_be_kernels [hp_iterations=200] [be_kernels_per_hp=4]
//   USE_ORION_SCHEDULER=1 LD_PRELOAD=/path/libgpu_scheduler.so gpu_hp_be_kernels 200 4
// Exit status 0 when every result is correct, 1 otherwise, 2 on a CUDA error or bad argument.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "orion.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                   cudaGetErrorString(err_));                                            \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

// Best effort: many rounds of a multiply-add per element (long, compute bound).
__global__ void be_kernel(float* y, const float* x, int n, int rounds) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = y[i];
  for (int r = 0; r < rounds; ++r) v = v * 0.999f + x[i] * 0.001f;
  y[i] = v;
}

// High priority: short vector add.
__global__ void hp_kernel(float* c, const float* a, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// be_kernels_per_hp may be 0: the HP client alone, the reference its latency is judged against.
static long arg(int argc, char** argv, int i, long fallback, long least) {
  if (argc <= i) return fallback;
  char* end = nullptr;
  long v = std::strtol(argv[i], &end, 10);
  if (end == argv[i] || *end != '\0' || v < least) {
    std::fprintf(stderr, "usage: %s [hp_iterations>0] [be_kernels_per_hp>=0] (got '%s')\n", argv[0],
                 argv[i]);
    std::exit(2);
  }
  return v;
}

int main(int argc, char** argv) {
  const int hp_iters = static_cast<int>(arg(argc, argv, 1, 200, 1));
  const int be_per_hp = static_cast<int>(arg(argc, argv, 2, 4, 0));
  const int n_be = 1 << 22, n_hp = 1 << 16, rounds = 2000;

  int least = 0, greatest = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t hp, be;
  CHECK(cudaStreamCreateWithPriority(&hp, cudaStreamNonBlocking, greatest));
  CHECK(cudaStreamCreateWithPriority(&be, cudaStreamNonBlocking, least));

  float *bx, *by, *ha, *hb, *hc;
  CHECK(cudaMalloc(&bx, n_be * sizeof(float)));
  CHECK(cudaMalloc(&by, n_be * sizeof(float)));
  CHECK(cudaMalloc(&ha, n_hp * sizeof(float)));
  CHECK(cudaMalloc(&hb, n_hp * sizeof(float)));
  CHECK(cudaMalloc(&hc, n_hp * sizeof(float)));
  std::vector<float> host_x(n_be, 1.0f), host_a(n_hp), host_b(n_hp), host_c(n_hp);
  for (int i = 0; i < n_hp; ++i) host_a[i] = float(i), host_b[i] = float(2 * i);
  CHECK(cudaMemcpy(bx, host_x.data(), n_be * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(by, 0, n_be * sizeof(float)));
  CHECK(cudaMemcpy(ha, host_a.data(), n_hp * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(hb, host_b.data(), n_hp * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaDeviceSynchronize());

  std::vector<double> latency_us;
  latency_us.reserve(hp_iters);
  const auto start = std::chrono::steady_clock::now();
  for (int it = 0; it < hp_iters; ++it) {
    for (int k = 0; k < be_per_hp; ++k) {
      be_kernel<<<(n_be + 255) / 256, 256, 0, be>>>(by, bx, n_be, rounds);
      CHECK(cudaGetLastError());
    }
    const auto t0 = std::chrono::steady_clock::now();
    hp_kernel<<<(n_hp + 255) / 256, 256, 0, hp>>>(hc, ha, hb, n_hp);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(hp));
    latency_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  CHECK(cudaStreamSynchronize(be));
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  // Results: c = a + b; y converges towards x after rounds * kernels iterations.
  CHECK(cudaMemcpy(host_c.data(), hc, n_hp * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<float> host_y(n_be);
  CHECK(cudaMemcpy(host_y.data(), by, n_be * sizeof(float), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n_hp; ++i) bad += host_c[i] != host_a[i] + host_b[i];
  const float expect_y = 1.0f - std::pow(0.999f, float(rounds) * hp_iters * be_per_hp);
  for (int i = 0; i < n_be; i += 4099) bad += std::fabs(host_y[i] - expect_y) > 1e-2f;

  std::sort(latency_us.begin(), latency_us.end());
  auto pct = [&](double p) { return latency_us[std::min(latency_us.size() - 1, size_t(p * latency_us.size()))]; };
  auto active = reinterpret_cast<orion_is_active_fn>(dlsym(RTLD_DEFAULT, "orion_is_active"));
  std::printf("orion_scheduler=%s hp_iterations=%d be_kernels_per_hp=%d\n",
              active == nullptr ? "not-loaded" : (active() ? "on" : "pass-through"), hp_iters,
              be_per_hp);
  std::printf("hp_latency_us median=%.1f p90=%.1f p99=%.1f max=%.1f\n", pct(0.5), pct(0.9),
              pct(0.99), latency_us.back());
  std::printf("wall_ms=%.1f results=%s (%d mismatches)\n", wall_ms, bad ? "WRONG" : "ok", bad);
  return bad ? 1 : 0;
}
