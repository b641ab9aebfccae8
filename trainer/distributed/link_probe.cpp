// measure_gloo_allreduce: what one all-reduce between two Gloo ranks costs on this machine, the
// collective data-parallel replicas run per stage each step. Two threads of this process act as
// the two ranks (loopback TCP, as two processes on one node would use).
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "distributed_internal.h"
#include "trainer/distributed/distributed.h"

namespace gpipe {

LinkCost measure_gloo_allreduce(int64_t bytes) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  constexpr int kSmallRounds = 30, kLargeRounds = 5;
  const int64_t elements = std::max<int64_t>(1, bytes / 4);
  double small_ms = 0, large_ms = 0;
  auto rank_main = [&](int rank) {
    auto backend = make_gloo_backend(store, rank, 2, std::chrono::seconds(60));
    auto run = [&](int64_t n, int rounds) {
      std::vector<at::Tensor> t{at::ones({n})};
      backend->allreduce(t)->wait();  // warm-up (connections, buffers)
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < rounds; ++i) backend->allreduce(t)->wait();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / rounds;
    };
    const double s = run(1, kSmallRounds);
    const double l = run(elements, kLargeRounds);
    if (rank == 0) small_ms = s, large_ms = l;
  };
  // Either rank's failure (no loopback device, a timeout) is rethrown here once both have ended.
  std::exception_ptr peer_error, own_error;
  std::thread peer([&] {
    try {
      rank_main(1);
    } catch (...) {
      peer_error = std::current_exception();
    }
  });
  try {
    rank_main(0);
  } catch (...) {
    own_error = std::current_exception();
  }
  peer.join();
  if (own_error) std::rethrow_exception(own_error);
  if (peer_error) std::rethrow_exception(peer_error);
  return LinkCost{small_ms, std::max(0.0, large_ms - small_ms) / static_cast<double>(elements * 4)};
}

}  // namespace gpipe
