// The release rules of graph executables (issue 24's finding 5 and later ones): a held launch of
// an executable runs it as it was when launched (an edit releases it first), launches and uploads
// of one executable keep CUDA's order across streams, an instantiation that uploads comes after
// its stream's held work, and a replay of NCCL kernels is never held. Each test fails on the shim
// before its fix. Run twice by ctest: scheduled and pass-through.
#include "release_rules_fixture.h"

namespace {

using namespace icpt_test;

// Instantiating with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD also uploads the executable into the
// params' stream, behind that stream's work (as cuGraphUpload): a launch held there reaches the
// driver first. The instantiate call went straight to the driver (it is order-free otherwise).
TEST_F(ReleaseRules, InstantiatingWithAnUploadReleasesTheUploadStreamFirst) {
  CUgraph graph = nullptr;
  ASSERT_EQ(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  CUDA_GRAPH_INSTANTIATE_PARAMS params{};
  params.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
  params.hUploadStream = be_;
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithParams(&exec, graph, &params), CUDA_SUCCESS);
  const auto log = calls();
  const long held = find_launch(log, k_be_), upload = find_named(log, "cuGraphInstantiateWithParams", h(be_));
  ASSERT_GE(upload, 0);
  ASSERT_GE(held, 0) << "the launch held on the upload stream did not reach the driver before the upload";
  EXPECT_LT(held, upload);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
}

// Finding 5: a held launch of a graph executable must run the executable as it was when it was
// launched: an edit after the launch first releases it.
TEST_F(ReleaseRules, EditingAGraphExecutableFirstReleasesItsHeldLaunch) {
  CUgraphNode node = nullptr;
  const CUgraphExec exec = make_graph_exec(k_be_, &node);
  ASSERT_NE(exec, nullptr);
  for (const char* edit : {"cuGraphExecKernelNodeSetParams_v2", "cuGraphNodeSetEnabled",
                           "cuGraphExecNodeSetParams"}) {
    SCOPED_TRACE(edit);
    fake_cuda_reset();
    hold_high_priority();
    ASSERT_EQ(cuGraphLaunch(exec, be_), CUDA_SUCCESS);
    expect_held("cuGraphLaunch", be_);
    CUDA_KERNEL_NODE_PARAMS params{};
    CUgraphNodeParams node_params{};
    if (std::strcmp(edit, "cuGraphNodeSetEnabled") == 0) {
      ASSERT_EQ(cuGraphNodeSetEnabled(exec, node, 0), CUDA_SUCCESS);
    } else if (std::strcmp(edit, "cuGraphExecNodeSetParams") == 0) {
      ASSERT_EQ(cuGraphExecNodeSetParams(exec, node, &node_params), CUDA_SUCCESS);
    } else {
      ASSERT_EQ(cuGraphExecKernelNodeSetParams(exec, node, &params), CUDA_SUCCESS);
    }
    auto log = calls();
    const long launched = find_named(log, "cuGraphLaunch", h(be_));
    ASSERT_GE(launched, 0) << "the held launch is still held after the edit";
    EXPECT_LT(launched, find_any(log, edit));
    fake_cuda_set_stream_busy(hp_, 0);
    EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  }
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
}

// Finding 5: CUDA orders each launch of an executable behind its previous launches; a held
// best-effort launch followed by a high-priority launch of the same executable ran in reverse.
TEST_F(ReleaseRules, LaunchesOfOneGraphExecutableKeepTheirOrderAcrossStreams) {
  expect_behind_the_executables_held_launch("cuGraphLaunch", &cuGraphLaunch);
}

// CUDA orders an upload of an executable behind its earlier launches, on any stream, and the work
// after the upload on its stream waits for them. A held best-effort launch of the executable must
// reach the driver before an upload of it on a high-priority stream (the upload used to pass it).
TEST_F(ReleaseRules, AGraphUploadComesAfterTheExecutablesHeldLaunch) {
  expect_behind_the_executables_held_launch("cuGraphUpload", &cuGraphUpload);
}

// Finding 5: a CUDA graph captured around NCCL kernels spins until its peers arrive, like the
// kernels themselves; a replay held on a best-effort stream made the peers wait up to the
// starvation bound. A graph with a communication kernel node makes its stream a communication
// stream: its launches are never held.
TEST_F(ReleaseRules, AGraphOfNcclKernelsIsNeverHeld) {
  CUfunction nccl = fake_cuda_make_function(kNcclAllReduceMangled, 0, nullptr);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUDA_KERNEL_NODE_PARAMS params{};
  params.func = nccl;
  params.gridDimX = params.gridDimY = params.gridDimZ = 1;
  params.blockDimX = params.blockDimY = params.blockDimZ = 1;
  CUgraphNode node = nullptr;
  ASSERT_EQ(cuGraphAddKernelNode(&node, graph, nullptr, 0, &params), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  const uint64_t comm_before = stats().communication_streams;
  hold_high_priority();
  ASSERT_EQ(cuGraphLaunch(exec, be_), CUDA_SUCCESS);
  EXPECT_GE(find_named(calls(), "cuGraphLaunch", h(be_)), 0) << "the NCCL graph replay was held back";
  if (scheduled_) {
    EXPECT_EQ(stats().communication_streams, comm_before + 1);
  }
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  // be_ is a communication stream from now on; the fixture makes a new one per test.
}

}  // namespace
