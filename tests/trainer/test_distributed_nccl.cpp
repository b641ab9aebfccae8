// The project's NCCL process group on one GPU: a one-rank communicator made by
// Distributed::new_group(..., "nccl") (c10d's ProcessGroupNCCL behind ProcessGroup), its in-place
// and its started all-reduce. NCCL refuses two ranks of one communicator on one GPU, so this is
// what one GPU can prove of that code; the NCCL pipeline transport (a communicator per pair of
// ranks in different processes) needs two GPUs: check (e2) of scripts/gpu_check.sh.
// CUDA-only ("Cuda" in the name: ctest's gpu.engine_tests.cuda runs it on the GPU machine).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "free_port.h"
#include "trainer/device/device.h"
#include "trainer/distributed/distributed.h"
#include "trainer/launch/world.h"

namespace gpipe {
namespace {

using testing::free_port;

TEST(DistributedCuda, OneRankNcclGroupSumsInPlaceAndStarted) {
  if (!cuda_usable()) GTEST_SKIP() << "needs a CUDA GPU (none visible, or a build without LibTorch-CUDA)";
  WorldInfo world;  // one process: rank 0 of 1, hosting the store
  world.master_port = free_port();
  ASSERT_GT(world.master_port, 0);
  auto dist = Distributed::connect(world, "one-rank-nccl-test", DistributedOptions{std::chrono::milliseconds(30000)});
  auto group = dist->new_group("nccl_one", {0}, "nccl");
  EXPECT_EQ(group->backend(), "nccl");
  EXPECT_EQ(group->size(), 1);

  at::Tensor t = at::arange(8, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  group->all_reduce_sum_in_place(t);
  EXPECT_TRUE(at::equal(t.cpu(), at::arange(8, at::kFloat)));

  at::Tensor u = at::full({1024}, 2.5, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  auto pending = group->start_all_reduce_sum(u);
  pending.wait();
  EXPECT_TRUE(at::equal(u.cpu(), at::full({1024}, 2.5, at::kFloat)));

  // A CPU tensor on an NCCL group is refused by name, not handed to NCCL.
  at::Tensor cpu = at::zeros({2});
  EXPECT_THROW(group->all_reduce_sum_in_place(cpu), std::exception);
  group.reset();
  dist->finish();
}

}  // namespace
}  // namespace gpipe
