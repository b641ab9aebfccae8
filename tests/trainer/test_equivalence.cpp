// After one step, every schedule on both executors gives the unpipelined model's loss and
// parameter gradients (same weights, same batch, one stage with all layers, no micro-batching).
// Tolerance (fp32): rtol 1e-4, atol 1e-5.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "test_engine_helpers.h"
#include "trainer/device/device.h"
#include "trainer/distributed/transport.h"
#include "trainer/execution/executor.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/metrics/timeline.h"

namespace gpipe::testing {
namespace {

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

struct Reference {
  double loss = 0;
  std::vector<at::Tensor> grads;  // in layer order
};

// The whole model as one stage, run on the whole batch.
Reference unpipelined(const TinySetup& s, const Batch& batch) {
  TinyModel model(s.blocks, s.costs);
  model.configure(tiny_config(s).model);
  TinyStage stage;
  StageSpec all{0, 1, 0, s.blocks + 2, 0.0};
  auto module = stage.create_sub_model(model, all, tiny_config(s).training.seed);
  at::Tensor loss = stage.compute_loss(module->forward(stage.prepare_input(batch)), batch);
  loss.backward();
  Reference ref;
  ref.loss = loss.item<double>();
  for (const auto& p : module->parameters()) ref.grads.push_back(p.grad().clone());
  return ref;
}

using Param = std::tuple<std::string, std::string, std::string>;  // schedule, executor, overlap_f_b

class EquivalenceTest : public ::testing::TestWithParam<Param> {};

TEST_P(EquivalenceTest, OneStepMatchesUnpipelinedLossAndGradients) {
  TinySetup s;
  s.schedule = std::get<0>(GetParam());
  s.executor = std::get<1>(GetParam());
  s.overlap_f_b = std::get<2>(GetParam());
  const bool multi_stage = s.schedule == "interleaved_1f1b" || s.schedule == "looped_bfs" ||
                           s.schedule == "interleaved_zb" || s.schedule == "zbv" || s.schedule == "dualpipev";
  if (multi_stage) s.virtual_stages = 2;
  const Batch batch = tiny_batch(s.batch, s.seq, s.vocab, 7);
  const Reference ref = unpipelined(s, batch);

  auto trainer = make_tiny_trainer(s);
  ASSERT_EQ(trainer->schedule().num_stages(), s.ranks * s.virtual_stages);
  // overlap_f_b=true pairs every kind's steady state (these shapes have one); auto keeps
  // dualpipev's own pairs; false has none.
  const int pairs = count_overlapped_pairs(trainer->schedule());
  if (s.overlap_f_b == "true" || (s.overlap_f_b == "auto" && s.schedule == "dualpipev")) {
    EXPECT_GT(pairs, 0) << "the schedule has no overlapped pair to test";
  } else {
    EXPECT_EQ(pairs, 0);
  }
  const double loss = trainer->forward_backward(batch);
  EXPECT_NEAR(loss, ref.loss, kAtol + kRtol * std::abs(ref.loss));

  std::vector<at::Tensor> grads;
  for (const auto& st : trainer->stages()) {
    for (const auto& p : st->parameters()) {
      ASSERT_TRUE(p.grad().defined()) << "stage " << st->spec().stage << " has a parameter without gradient";
      grads.push_back(p.grad());
    }
  }
  ASSERT_EQ(grads.size(), ref.grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_EQ(grads[i].sizes(), ref.grads[i].sizes()) << "parameter " << i;
    EXPECT_TRUE(at::allclose(grads[i], ref.grads[i], kRtol, kAtol))
        << "parameter " << i << " max abs diff " << (grads[i] - ref.grads[i]).abs().max().item<double>();
  }
  // A second step starts from clean gradients (zero_grad) and gives the same result again.
  const double again = trainer->forward_backward(batch);
  EXPECT_DOUBLE_EQ(again, loss);
}

auto param_name = [](const ::testing::TestParamInfo<Param>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_overlap_" + std::get<2>(info.param);
};

INSTANTIATE_TEST_SUITE_P(AllSchedulesBothExecutors, EquivalenceTest,
                         ::testing::Combine(::testing::Values("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "looped_bfs",
                                                              "interleaved_zb", "zbv", "dualpipev"),
                                            ::testing::Values("naive", "async_threaded"),
                                            ::testing::Values("auto")),
                         param_name);
// Overlapped pairs: added to the kinds with a steady state (gpipe and looped_bfs run all
// forwards, then all backwards: no forward is followed by another micro-batch's backward), taken
// out of dualpipev.
INSTANTIATE_TEST_SUITE_P(OverlappedPairsBothExecutors, EquivalenceTest,
                         ::testing::Combine(::testing::Values("1f1b", "interleaved_1f1b", "zb_h1",
                                                              "interleaved_zb", "zbv", "dualpipev"),
                                            ::testing::Values("naive", "async_threaded"),
                                            ::testing::Values("true")),
                         param_name);
INSTANTIATE_TEST_SUITE_P(DualPipeVWithoutPairs, EquivalenceTest,
                         ::testing::Combine(::testing::Values("dualpipev"), ::testing::Values("naive", "async_threaded"),
                                            ::testing::Values("false")),
                         param_name);

// The async executor really runs an overlapped pair's halves at once: blocks that sleep in
// forward and in backward (no CPU contention), 1F1B with overlap_f_b=true; on rank 0 each paired
// forward runs on the forward lane while its backward runs on the rank's thread, so their spans
// intersect. The naive executor runs the same pairs one after the other.
TEST(OverlappedPairTest, AsyncRunsTheForwardOnTheLaneAtTheSameTimeAsTheBackward) {
  for (const std::string executor : {"async_threaded", "naive"}) {
    TinySetup s;
    s.executor = executor;
    s.overlap_f_b = "true";
    s.costs.forward_sleep_ms = 20;
    s.costs.backward_sleep_ms = 20;
    auto trainer = make_tiny_trainer(s);
    ActionRecorder recorder;
    trainer->forward_backward(tiny_batch(s.batch, s.seq, s.vocab, 3), &recorder);
    const auto& spans = recorder.spans(0);
    int pairs = 0, on_lane = 0;
    double overlapped_us = 0;
    const auto& program = trainer->schedule().per_rank[0];
    for (size_t k = 0; k + 1 < program.size(); ++k) {
      if (!program[k].overlaps_next) continue;
      ++pairs;
      auto span_of = [&](const Action& a) {
        auto plain = a;
        plain.overlaps_next = false;
        auto it = std::find_if(spans.begin(), spans.end(), [&](const ActionSpan& sp) {
          auto b = sp.action;
          b.overlaps_next = false;
          return b == plain;
        });
        EXPECT_NE(it, spans.end()) << to_string(a) << " recorded no span";
        return it == spans.end() ? ActionSpan{} : *it;
      };
      const ActionSpan f = span_of(program[k]), b = span_of(program[k + 1]);
      on_lane += f.lane == ActionLane::kForwardLane;
      EXPECT_EQ(b.lane, ActionLane::kRank);
      overlapped_us += std::max(0.0, std::min(f.end_us, b.end_us) - std::max(f.start_us, b.start_us));
    }
    ASSERT_GT(pairs, 0) << "1F1B with overlap_f_b=true has no pair on rank 0";
    if (executor == "async_threaded") {
      EXPECT_EQ(on_lane, pairs) << "every paired forward runs on the rank's forward lane";
      EXPECT_GT(overlapped_us, 0.0) << "the halves of the pairs never ran at the same time";
      // Busy time counts the overlapped stretches once: less than the sum of the compute spans.
      double summed_us = 0;
      for (const auto& sp : spans)
        if (is_compute(sp.action.type)) summed_us += sp.end_us - sp.start_us;
      EXPECT_LT(recorder.busy_us(0), summed_us - 0.5 * overlapped_us);
    } else {
      EXPECT_EQ(on_lane, 0);
      EXPECT_EQ(overlapped_us, 0.0) << "the naive executor runs a pair in order";
    }
  }
}

// The async executor keeps its threads across steps: every compute action of a rank, in every
// step, runs on the one thread named "rank<r>" (a paired forward on the one "rank<r>-fwd"), and no
// two ranks share a thread. Nsight and Perfetto then show one named track per rank, and what
// LibTorch and the CUDA libraries keep per thread is made once (on the H100, each rank thread's
// first forward and first backward of a step took 60-90 ms when threads were made per step).
TEST(AsyncExecutorTest, KeepsOneNamedThreadPerRankAcrossSteps) {
  TinySetup s;
  s.executor = "async_threaded";
  s.overlap_f_b = "true";
  auto trainer = make_tiny_trainer(s);
  std::mutex mu;
  // Kernel thread ids: glibc reuses a joined thread's pthread_t (std::thread::id) for the next one.
  std::map<std::string, std::set<long>> threads_by_name;
  std::map<int, std::set<std::string>> names_by_rank;
  ActionRecorder recorder;
  recorder.set_compute_hooks(
      [&](int rank) {
        char name[16] = {};
        pthread_getname_np(pthread_self(), name, sizeof name);
        std::lock_guard<std::mutex> lock(mu);
        threads_by_name[name].insert(syscall(SYS_gettid));
        names_by_rank[rank].insert(name);
      },
      nullptr);
  for (int step = 0; step < 3; ++step) trainer->forward_backward(tiny_batch(s.batch, s.seq, s.vocab, 3 + step), &recorder);
  ASSERT_EQ(names_by_rank.size(), static_cast<size_t>(s.ranks));
  for (const auto& [rank, names] : names_by_rank) {
    const std::string own = "rank" + std::to_string(rank);
    for (const auto& name : names) {
      EXPECT_TRUE(name == own || name == own + "-fwd") << "rank " << rank << " ran an action on thread '" << name << "'";
    }
    EXPECT_TRUE(names.count(own)) << "rank " << rank << " never ran on its own thread";
  }
  EXPECT_TRUE(threads_by_name.count("rank0-fwd")) << "1F1B with overlap_f_b=true pairs on rank 0: its lane ran nothing";
  for (const auto& [name, ids] : threads_by_name) {
    EXPECT_EQ(ids.size(), 1u) << "'" << name << "' was " << ids.size() << " different threads over 3 steps";
  }
}

TEST(EquivalenceTest, FourRanksEightMicrobatchesOneFOneB) {
  TinySetup s;
  s.ranks = 4;
  s.microbatches = 8;
  s.batch = 16;
  s.blocks = 6;
  const Batch batch = tiny_batch(s.batch, s.seq, s.vocab, 11);
  const Reference ref = unpipelined(s, batch);
  auto trainer = make_tiny_trainer(s);
  EXPECT_NEAR(trainer->forward_backward(batch), ref.loss, kAtol + kRtol * std::abs(ref.loss));
  size_t i = 0;
  for (const auto& st : trainer->stages()) {
    for (const auto& p : st->parameters()) {
      ASSERT_LT(i, ref.grads.size());
      EXPECT_TRUE(at::allclose(p.grad(), ref.grads[i], kRtol, kAtol)) << "parameter " << i;
      ++i;
    }
  }
  EXPECT_EQ(i, ref.grads.size());
}

// Backward runs on the thread that runs the action, with autograd's device worker threads off:
// otherwise the CUDA backward of every co-located rank goes through one shared autograd thread.
// On CPU the engine runs backward on the calling thread either way, so the probe checks the
// setting the engine carries into the backward (it reads true without BackwardOnCallingThread),
// and that the thread which ran each backward is one of the threads that ran forwards. The
// calling thread's own setting is restored after the step.
class BackwardThreadTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackwardThreadTest, BackwardRunsOnTheRankThreadWithAutogradThreadsOff) {
  TinySetup s;
  s.executor = GetParam();
  s.schedule = "zb_h1";  // B, I and W all run
  s.costs.probe_threads = true;
  auto trainer = make_tiny_trainer(s);
  auto& log = BackwardThreadProbe::log();
  {
    std::lock_guard<std::mutex> lock(log.mu);
    log.forward_threads.clear();
    log.backward_threads.clear();
    log.backward_calls = log.backward_calls_with_autograd_threads = 0;
  }
  ASSERT_TRUE(c10::AutogradState::get_tls_state().get_multithreading_enabled());
  trainer->forward_backward(tiny_batch(s.batch, s.seq, s.vocab, 5));
  EXPECT_TRUE(c10::AutogradState::get_tls_state().get_multithreading_enabled()) << "the caller's setting was not restored";
  std::lock_guard<std::mutex> lock(log.mu);
  EXPECT_GT(log.backward_calls, 0);
  EXPECT_EQ(log.backward_calls_with_autograd_threads, 0)
      << log.backward_calls_with_autograd_threads << " of " << log.backward_calls
      << " backward calls could have been handed to autograd's worker threads";
  for (const auto& id : log.backward_threads) {
    EXPECT_NE(std::find(log.forward_threads.begin(), log.forward_threads.end(), id), log.forward_threads.end())
        << "a backward ran on a thread that ran no forward";
  }
}

INSTANTIATE_TEST_SUITE_P(BothExecutors, BackwardThreadTest, ::testing::Values("naive", "async_threaded"));

// The async executor on CUDA: per-micro-batch rank streams with priorities and events between
// them, or one stream per rank, must still give the CPU reference's gradients (fp32; looser
// tolerance for GPU kernels).
TEST(EquivalenceTest, CudaStreamsMatchTheCpuReference) {
  if (!cuda_usable()) GTEST_SKIP() << "needs a CUDA GPU (none visible, or a build without LibTorch-CUDA)";
  for (const auto& [schedule, streams] : std::vector<std::pair<std::string, std::string>>{
           {"1f1b", "per_microbatch"}, {"zb_h1", "per_microbatch"}, {"1f1b", "per_rank"}, {"zb_h1", "per_rank"}}) {
    SCOPED_TRACE(schedule + ", parallel.streams=" + streams);
    TinySetup s;
    s.schedule = schedule;
    s.streams = streams;
    s.device = "cuda";
    const Batch batch = tiny_batch(s.batch, s.seq, s.vocab, 13);
    const Reference ref = unpipelined(s, batch);
    auto trainer = make_tiny_trainer(s);
    EXPECT_NEAR(trainer->forward_backward(batch), ref.loss, 1e-4 + 1e-3 * std::abs(ref.loss)) << schedule;
    size_t i = 0;
    for (const auto& st : trainer->stages()) {
      for (const auto& p : st->parameters()) {
        ASSERT_LT(i, ref.grads.size());
        EXPECT_TRUE(p.grad().is_cuda());
        EXPECT_TRUE(at::allclose(p.grad().cpu(), ref.grads[i], 1e-3, 1e-4)) << schedule << " parameter " << i;
        ++i;
      }
    }
  }
}

// A warm training step takes all its memory from the caching allocator's cache: no cudaMalloc,
// no retry, under either executor and either stream layout (per_microbatch gives every
// micro-batch's forward a stream of its own, and the allocator caches blocks per stream). On the H100 the async executor's first
// forward and first backward of each rank took 60-90 ms a step; this says whether the allocator
// was going to the driver then.
TEST(AllocatorCudaTest, WarmStepsMakeNoCudaMalloc) {
  if (!cuda_usable()) GTEST_SKIP() << "GPU-only: no CUDA device visible (runs in ctest -L gpu on the GPU machine)";
  for (const std::string executor : {"naive", "async_threaded", "async_threaded per_rank"}) {
    TinySetup s;
    s.executor = executor.substr(0, executor.find(' '));
    if (executor.find("per_rank") != std::string::npos) s.streams = "per_rank";
    s.device = "cuda";
    s.ranks = 4;
    s.microbatches = 8;
    s.batch = 16;
    s.seq = 64;
    s.hidden = 256;
    s.blocks = 8;
    auto trainer = make_tiny_trainer(s);
    const std::vector<c10::Device> devices = resolve_rank_devices("cuda", s.ranks);  // as the trainer placed them
#ifdef OURGPIPE_HAVE_TORCH_CUDA
    c10::cuda::CUDACachingAllocator::emptyCache();  // what earlier tests cached: the warm-up must allocate
#endif
    const auto fresh = allocator_activity(devices);
    ASSERT_TRUE(fresh.has_value());
    for (int step = 0; step < 3; ++step) {
      trainer->forward_backward(tiny_batch(s.batch, s.seq, s.vocab, 20 + step));
      trainer->optimizer_step(step);
    }
    synchronize_devices(devices);
    const auto before = allocator_activity(devices);
    ASSERT_TRUE(before.has_value());
    // The counters are alive: the warm-up steps did allocate from the driver.
    ASSERT_GT(allocator_activity_since(*fresh, *before).device_mallocs, 0) << executor;
    for (int step = 3; step < 5; ++step) {
      trainer->forward_backward(tiny_batch(s.batch, s.seq, s.vocab, 20 + step));
      trainer->optimizer_step(step);
    }
    synchronize_devices(devices);
    const auto d = allocator_activity_since(*before, *allocator_activity(devices));
    EXPECT_EQ(d.device_mallocs, 0) << executor << ": warm steps called cudaMalloc " << d.device_mallocs << " time(s)";
    EXPECT_EQ(d.alloc_retries, 0) << executor;
    EXPECT_EQ(d.sync_all_streams, 0) << executor;
  }
}

// A rank that fails (token ids outside the vocabulary: the embedding throws on rank 0) makes the
// step fail fast with that rank's error, not with its peers' timeouts; the next step runs clean.
class FailingRankTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FailingRankTest, RootCauseIsReportedAndTheNextStepRuns) {
  TinySetup s;
  s.executor = GetParam();
  auto trainer = make_tiny_trainer(s);
  Batch bad = tiny_batch(s.batch, s.seq, s.vocab, 1);
  bad.input_ids = bad.input_ids + 1000;
  const auto start = std::chrono::steady_clock::now();
  try {
    trainer->forward_backward(bad);
    FAIL() << "a batch with out-of-range token ids ran";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0 action 0F0"), std::string::npos) << what;
    EXPECT_EQ(what.find("waited"), std::string::npos) << "a peer's timeout was reported instead: " << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << "peers were not aborted";
  const Batch good = tiny_batch(s.batch, s.seq, s.vocab, 2);
  EXPECT_NO_THROW(trainer->forward_backward(good));
}

// The last rank fails in the middle of a step (micro-batch 1's targets are outside the
// vocabulary: its loss throws), when activations for later micro-batches are already on their way
// to it. What the failed step left undelivered must not reach the next step: the naive executor
// kept it, and the next step's first send of the same micro-batch failed as "sent twice".
TEST_P(FailingRankTest, AFailureMidStepLeavesNothingForTheNextStep) {
  TinySetup s;
  s.executor = GetParam();
  s.ranks = 3;
  s.microbatches = 4;
  s.batch = 8;  // micro-batches of 2 rows
  auto trainer = make_tiny_trainer(s);
  Batch bad = tiny_batch(s.batch, s.seq, s.vocab, 1);
  bad.targets.narrow(0, 2, 2).fill_(s.vocab + 7);  // micro-batch 1 only
  try {
    trainer->forward_backward(bad);
    FAIL() << "targets outside the vocabulary trained";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 action 2F1"), std::string::npos) << e.what();
  }
  const Batch good = tiny_batch(s.batch, s.seq, s.vocab, 2);
  EXPECT_NO_THROW(trainer->forward_backward(good));
}

// Delivers every message, but reports itself aborted from the first receive on: what an NCCL
// transport looks like when the monitor or its watchdog aborted it after the step's receives were
// posted (the consumer's stream waits on them; the abort ends them without their data).
class AbortedDuringTheStep final : public Transport {
 public:
  explicit AbortedDuringTheStep(int ranks) : inner_(make_inprocess_transport(ranks)) {}
  void send(const TransferKey& key, Message message) override { inner_->send(key, std::move(message)); }
  Message recv(const TransferKey& key, std::chrono::milliseconds timeout) override {
    aborted_ = true;
    return inner_->recv(key, timeout);
  }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  std::string aborted_reason() const override { return aborted_ ? "rank 1: ncclRecv did not complete" : ""; }
  size_t reset() override {
    aborted_ = false;
    return inner_->reset();
  }
  size_t pending() const override { return inner_->pending(); }

 private:
  std::unique_ptr<Transport> inner_;
  std::atomic<bool> aborted_{false};
};

// A step during which the transport was aborted ran through, and its gradients, with whatever the
// aborted transfers left in their buffers, went on to the optimizer.
TEST_P(FailingRankTest, AStepDuringWhichTheTransportWasAbortedFails) {
  TinySetup s;
  s.executor = GetParam();
  auto trainer = make_tiny_trainer(s);
  AbortedDuringTheStep transport(s.ranks);
  StepContext ctx;
  ctx.schedule = &trainer->schedule();
  ctx.rank_devices.assign(static_cast<size_t>(s.ranks), c10::Device(c10::kCPU));
  ctx.transport = &transport;
  for (const auto& stage : trainer->stages()) {
    stage->begin_step();
    stage->zero_grad();
    ctx.stages.push_back(stage.get());
  }
  const Batch batch = tiny_batch(s.batch, s.seq, s.vocab, 3);
  const auto inputs = batch.input_ids.chunk(s.microbatches, 0), targets = batch.targets.chunk(s.microbatches, 0);
  for (int i = 0; i < s.microbatches; ++i) ctx.microbatches.push_back(Batch{inputs[i], targets[i]});
  const auto executor = make_executor(s.executor);
  try {
    executor->run_step(ctx);
    FAIL() << "a step whose transport was aborted ran through";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("the step's transfers were aborted: rank 1: ncclRecv"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(transport.aborted_reason(), "") << "the failed step did not reset the transport";
}

INSTANTIATE_TEST_SUITE_P(BothExecutors, FailingRankTest, ::testing::Values("naive", "async_threaded"));

}  // namespace
}  // namespace gpipe::testing
