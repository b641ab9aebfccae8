// Every stream-ordered and blocking driver entry point beyond launches, copies and events keeps
// the program's order under the shim: stream memory ops, batch and struct copies, synchronous
// copies and sets, callbacks, prefetch, attach, array copies, pool allocations and external
// semaphores. Each is checked behind a queued best-effort kernel (stream-ordered ones) or for
// draining first (blocking ones). Run twice by ctest: scheduled and pass-through.
#include <cstring>
#include <vector>

#include "scheduling_fixture.h"

namespace {

using namespace icpt_test;

TEST_F(Scheduling, StreamWriteValueKeepsStreamOrderAndReachesTheDriverBeforeReturning) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  // cuda.h maps cuStreamWriteValue32/64 to the _v2 symbols.
  ASSERT_EQ(cuStreamWriteValue32(be_, 0x1000, 7, 0), CUDA_SUCCESS);
  auto log = calls();
  long k = find_launch(log, k_be_);
  long w = find_named(log, "cuStreamWriteValue32_v2", h(be_));
  ASSERT_GE(k, 0) << "the kernel queued before the write must be submitted with it";
  ASSERT_GE(w, 0) << "a stream write must not be held back (a GPU-side waiter may block on it)";
  EXPECT_LT(k, w) << "the write overtook the kernel queued before it";
  EXPECT_EQ(log.at(w).value, 7u);
  // The stream stays best effort: later work is deferred again, and a 64-bit write after it
  // keeps its place too.
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  expect_deferred(k_other_);
  ASSERT_EQ(cuStreamWriteValue64(be_, 0x1008, 0x1234567890ull, 0), CUDA_SUCCESS);
  log = calls();
  long k2 = find_launch(log, k_other_);
  long w2 = find_named(log, "cuStreamWriteValue64_v2", h(be_));
  ASSERT_GE(k2, 0);
  ASSERT_GE(w2, 0);
  EXPECT_LT(w, k2);
  EXPECT_LT(k2, w2);
  EXPECT_EQ(log.at(w2).value, 0x1234567890ull);
}

// The driver's answer to a memory op is the caller's, also when the op went out behind queued
// best-effort work: programs probe support with it (CUDA_ERROR_NOT_SUPPORTED).
TEST_F(Scheduling, AStreamMemoryOpsDriverErrorIsReturnedToItsCaller) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  fake_cuda_fail_next("cuStreamWriteValue32_v2", CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuStreamWriteValue32(be_, 0x1000, 7, 0), CUDA_ERROR_NOT_SUPPORTED);
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  CUstreamBatchMemOpParams op{};
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = 0x1000;
  op.writeValue.value = 3;
  fake_cuda_fail_next("cuStreamBatchMemOp_v2", CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamBatchMemOp(be_, 1, &op, 0), CUDA_ERROR_INVALID_VALUE);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS) << "the memory ops' errors were left for a later call";
}

TEST_F(Scheduling, StreamWaitValueFirstSubmitsWorkQueuedOnEveryStream) {
  hold_high_priority();
  // A best-effort producer (it could be the kernel that sets the flag) is queued...
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  // ...and high priority waits on the flag: the producer must reach the driver first, or the HP
  // stream would block on the GPU behind work the scheduler holds back.
  ASSERT_EQ(cuStreamWaitValue32(hp_, 0x1000, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
  auto log = calls();
  long k = find_launch(log, k_be_);
  long wait = find_named(log, "cuStreamWaitValue32_v2", h(hp_));
  ASSERT_GE(k, 0);
  ASSERT_GE(wait, 0);
  EXPECT_LT(k, wait);
  // A wait on the best-effort stream itself stays behind that stream's queued work.
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  expect_deferred(k_other_);
  ASSERT_EQ(cuStreamWaitValue64(be_, 0x1008, 9, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
  log = calls();
  long k2 = find_launch(log, k_other_);
  long wait2 = find_named(log, "cuStreamWaitValue64_v2", h(be_));
  ASSERT_GE(k2, 0);
  ASSERT_GE(wait2, 0);
  EXPECT_LT(k2, wait2);
  EXPECT_EQ(log.at(wait2).value, 9u);
}

TEST_F(Scheduling, StreamBatchMemOpKeepsOrderAndPassesItsParameterArray) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  std::vector<CUstreamBatchMemOpParams> ops(3);
  std::memset(ops.data(), 0, ops.size() * sizeof ops[0]);
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = 0x1000;
  ops[0].writeValue.value = 5;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[1].writeValue.address = 0x1008;
  ops[1].writeValue.value64 = 600;
  ops[2].flushRemoteWrites.operation = CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES;
  ASSERT_EQ(cuStreamBatchMemOp(be_, 3, ops.data(), 0), CUDA_SUCCESS);
  ops.assign(3, CUstreamBatchMemOpParams{});  // the caller's array is gone
  auto log = calls();
  long k = find_launch(log, k_be_);
  long batch = find_named(log, "cuStreamBatchMemOp_v2", h(be_));
  ASSERT_GE(k, 0);
  ASSERT_GE(batch, 0);
  EXPECT_LT(k, batch);
  EXPECT_EQ(log.at(batch).value, 605u) << "the driver received other parameters";

  // A batch that waits drains other streams first, like cuStreamWaitValue*.
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  expect_deferred(k_other_);
  CUstreamBatchMemOpParams wait{};
  wait.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  wait.waitValue.address = 0x1000;
  wait.waitValue.value = 5;
  wait.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  ASSERT_EQ(cuStreamBatchMemOp(hp_, 1, &wait, 0), CUDA_SUCCESS);
  log = calls();
  long k2 = find_launch(log, k_other_);
  long batch2 = find_named(log, "cuStreamBatchMemOp_v2", h(hp_));
  ASSERT_GE(k2, 0);
  ASSERT_GE(batch2, 0);
  EXPECT_LT(k2, batch2);
}

TEST_F(Scheduling, SynchronousStructAndPeerCopiesWaitForAllQueuedWork) {
  CUDA_MEMCPY2D c2{};
  c2.srcMemoryType = c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c2.srcDevice = 0x1000;
  c2.dstDevice = 0x2000;
  c2.WidthInBytes = 16;
  c2.Height = 4;
  CUDA_MEMCPY3D c3{};
  c3.srcMemoryType = c3.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c3.srcDevice = 0x1000;
  c3.dstDevice = 0x2000;
  c3.WidthInBytes = 8;
  c3.Height = 2;
  c3.Depth = 3;
  CUDA_MEMCPY3D_PEER cp{};
  cp.srcMemoryType = cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.WidthInBytes = 4;
  cp.Height = cp.Depth = 1;
  const struct {
    const char* symbol;
    std::function<CUresult()> call;
  } cases[] = {
      {"cuMemcpy2D_v2", [&] { return cuMemcpy2D(&c2); }},
      {"cuMemcpy2DUnaligned_v2", [&] { return cuMemcpy2DUnaligned(&c2); }},
      {"cuMemcpy3D_v2", [&] { return cuMemcpy3D(&c3); }},
      {"cuMemcpyPeer", [&] { return cuMemcpyPeer(0x2000, nullptr, 0x1000, nullptr, 32); }},
      {"cuMemcpy3DPeer", [&] { return cuMemcpy3DPeer(&cp); }},
      {"cuCtxSynchronize_v2", [&] { return cuCtxSynchronize_v2(nullptr); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.symbol);
    fake_cuda_reset();
    hold_high_priority();
    ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
    expect_deferred(k_be_);
    ASSERT_EQ(c.call(), CUDA_SUCCESS);
    auto log = calls();
    long k = find_launch(log, k_be_);
    long sync = find_named(log, c.symbol, 0);
    ASSERT_GE(k, 0) << "queued best-effort work was not drained";
    ASSERT_GE(sync, 0);
    EXPECT_LT(k, sync);
  }
  auto log = calls();
  EXPECT_EQ(log.at(find_named(log, "cuCtxSynchronize_v2", 0)).result, CUDA_SUCCESS);
}

TEST_F(Scheduling, BatchCopiesKeepStreamOrderAndTheirCallerWaits) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  Releaser releaser = release_high_priority_once_a_caller_waits();
  CUdeviceptr dsts[] = {0x1000, 0x2000};
  CUdeviceptr srcs[] = {0x3000, 0x4000};
  size_t sizes[] = {64, 32};
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
  size_t attr_idx = 0;
  ASSERT_EQ(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &attr_idx, 1, be_), CUDA_SUCCESS);
  // Returned: the batch (and the kernel queued before it) is in the driver.
  auto log = calls();
  long k = find_launch(log, k_be_);
  long batch = find_named(log, "cuMemcpyBatchAsync_v2", h(be_));
  ASSERT_GE(k, 0);
  ASSERT_GE(batch, 0);
  EXPECT_LT(k, batch);
  EXPECT_EQ(log.at(batch).value, 96u);
  releaser.join();

  hold_high_priority();
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  expect_deferred(k_other_);
  Releaser releaser2 = release_high_priority_once_a_caller_waits();
  CUDA_MEMCPY3D_BATCH_OP op{};
  ASSERT_EQ(cuMemcpy3DBatchAsync(1, &op, 0, be_), CUDA_SUCCESS);
  log = calls();
  long k2 = find_launch(log, k_other_);
  long batch3d = find_named(log, "cuMemcpy3DBatchAsync_v2", h(be_));
  ASSERT_GE(k2, 0);
  ASSERT_GE(batch3d, 0);
  EXPECT_LT(k2, batch3d);
  releaser2.join();
  if (scheduled_) {
    EXPECT_GE(stats().caller_waits, 2u);
  }
}

TEST_F(Scheduling, StreamCallbacksPrefetchAndAttachKeepStreamOrder) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  static std::atomic<int> ran{0};
  ran = 0;
  int tag = 0;
  CUstreamCallback cb = [](CUstream, CUresult, void*) { ++ran; };
  ASSERT_EQ(cuStreamAddCallback(be_, cb, &tag, 0), CUDA_SUCCESS);
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = 0;
  // cuda.h (CUDA 13) maps cuMemPrefetchAsync to the _v2 symbol (CUmemLocation + flags).
  ASSERT_EQ(cuMemPrefetchAsync(0x1000, 4096, loc, 0, be_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamAttachMemAsync(be_, 0x1000, 0, CU_MEM_ATTACH_SINGLE), CUDA_SUCCESS);
  if (scheduled_) {
    auto log = calls();
    EXPECT_EQ(find_named(log, "cuStreamAddCallback", h(be_)), -1)
        << "the callback overtook the kernel queued before it";
    EXPECT_EQ(find_named(log, "cuMemPrefetchAsync_v2", h(be_)), -1);
    EXPECT_EQ(find_named(log, "cuStreamAttachMemAsync", h(be_)), -1);
    EXPECT_EQ(ran.load(), 0);
  }
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  auto log = calls();
  long k = find_launch(log, k_be_);
  long cbk = find_named(log, "cuStreamAddCallback", h(be_));
  long pf = find_named(log, "cuMemPrefetchAsync_v2", h(be_));
  long at = find_named(log, "cuStreamAttachMemAsync", h(be_));
  ASSERT_GE(k, 0);
  ASSERT_GE(cbk, 0);
  ASSERT_GE(pf, 0);
  ASSERT_GE(at, 0);
  EXPECT_LT(k, cbk);
  EXPECT_LT(cbk, pf);
  EXPECT_LT(pf, at);
  EXPECT_EQ(log.at(cbk).value, reinterpret_cast<uint64_t>(&tag));
  EXPECT_EQ(log.at(pf).value, 4096u);
  EXPECT_EQ(ran.load(), 1);
}

TEST_F(Scheduling, ArrayCopiesPoolAllocsAndSemaphoreSignalsKeepOrderAndTheirCallerWaits) {
  std::vector<unsigned char> pageable(512, 1);
  const CUarray arr = reinterpret_cast<CUarray>(0x40);
  const CUmemoryPool pool = reinterpret_cast<CUmemoryPool>(0x80);
  const CUexternalSemaphore sem = reinterpret_cast<CUexternalSemaphore>(0xc0);
  CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS sig{};
  sig.params.fence.value = 3;
  CUdeviceptr allocated = 0;
  const struct {
    const char* symbol;
    std::function<CUresult()> call;
  } cases[] = {
      {"cuMemcpyHtoAAsync_v2", [&] { return cuMemcpyHtoAAsync(arr, 0, pageable.data(), 512, be_); }},
      {"cuMemcpyAtoHAsync_v2", [&] { return cuMemcpyAtoHAsync(pageable.data(), arr, 0, 256, be_); }},
      {"cuMemAllocFromPoolAsync", [&] { return cuMemAllocFromPoolAsync(&allocated, 1024, pool, be_); }},
      {"cuSignalExternalSemaphoresAsync", [&] { return cuSignalExternalSemaphoresAsync(&sem, &sig, 1, be_); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.symbol);
    fake_cuda_reset();
    hold_high_priority();
    ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
    expect_deferred(k_be_);
    Releaser releaser = release_high_priority_once_a_caller_waits();
    ASSERT_EQ(c.call(), CUDA_SUCCESS);
    // Returned: the op (and the kernel queued before it) is in the driver.
    auto log = calls();
    long k = find_launch(log, k_be_);
    long op = find_named(log, c.symbol, h(be_));
    releaser.join();
    ASSERT_GE(k, 0);
    ASSERT_GE(op, 0) << "the caller returned before its op reached the driver";
    EXPECT_LT(k, op);
  }
  EXPECT_NE(allocated, 0u);
  if (scheduled_) {
    EXPECT_GE(stats().caller_waits, 4u);
  }
}

TEST_F(Scheduling, ExternalSemaphoreWaitFirstSubmitsWorkQueuedOnEveryStream) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  const CUexternalSemaphore sem = reinterpret_cast<CUexternalSemaphore>(0xc0);
  CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS wait{};
  ASSERT_EQ(cuWaitExternalSemaphoresAsync(&sem, &wait, 1, hp_), CUDA_SUCCESS);
  auto log = calls();
  long k = find_launch(log, k_be_);
  long w = find_named(log, "cuWaitExternalSemaphoresAsync", h(hp_));
  ASSERT_GE(k, 0) << "a best-effort producer queued before the wait was held back";
  ASSERT_GE(w, 0);
  EXPECT_LT(k, w);
  EXPECT_EQ(log.at(w).value, 1u);
}

TEST_F(Scheduling, SynchronousSetsAndArrayCopiesWaitForAllQueuedWork) {
  std::vector<unsigned char> host(64, 0);
  const CUarray arr = reinterpret_cast<CUarray>(0x40);
  const struct {
    const char* symbol;
    std::function<CUresult()> call;
  } cases[] = {
      {"cuMemsetD16_v2", [&] { return cuMemsetD16(0x1000, 7, 16); }},
      {"cuMemsetD2D8_v2", [&] { return cuMemsetD2D8(0x1000, 64, 1, 16, 2); }},
      {"cuMemsetD2D16_v2", [&] { return cuMemsetD2D16(0x1000, 64, 1, 16, 2); }},
      {"cuMemsetD2D32_v2", [&] { return cuMemsetD2D32(0x1000, 64, 1, 16, 2); }},
      {"cuMemcpyHtoA_v2", [&] { return cuMemcpyHtoA(arr, 0, host.data(), 64); }},
      {"cuMemcpyAtoH_v2", [&] { return cuMemcpyAtoH(host.data(), arr, 0, 64); }},
      {"cuMemcpyAtoD_v2", [&] { return cuMemcpyAtoD(0x1000, arr, 0, 64); }},
      {"cuMemcpyDtoA_v2", [&] { return cuMemcpyDtoA(arr, 0, 0x1000, 64); }},
      {"cuMemcpyAtoA_v2", [&] { return cuMemcpyAtoA(arr, 0, arr, 64, 64); }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.symbol);
    fake_cuda_reset();
    hold_high_priority();
    ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
    expect_deferred(k_be_);
    ASSERT_EQ(c.call(), CUDA_SUCCESS);
    auto log = calls();
    long k = find_launch(log, k_be_);
    long sync = find_named(log, c.symbol, 0);
    ASSERT_GE(k, 0) << "queued best-effort work was not drained";
    ASSERT_GE(sync, 0);
    EXPECT_LT(k, sync);
  }
}

}  // namespace
