// Google Benchmark (not a ctest test): cost of building, lowering, validating and simulating
// schedules at sizes beyond the unit tests. The runner validates its schedule at start-up, so
// this is start-up latency. Run: build-core/tests/trainer/bench_trainer_core
#include <benchmark/benchmark.h>

#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

struct Shape {
  ScheduleKind kind;
  int ranks, microbatches, chunks;
};
const Shape kShapes[] = {
    {ScheduleKind::kOneFOneB, 8, 64, 1},
    {ScheduleKind::kZeroBubbleH1, 32, 256, 1},
    {ScheduleKind::kInterleavedOneFOneB, 16, 128, 4},
};

void set_label(benchmark::State& state, const Shape& s) {
  state.SetLabel(std::string(to_string(s.kind)) + " p=" + std::to_string(s.ranks) + " m=" +
                 std::to_string(s.microbatches) + " v=" + std::to_string(s.chunks));
}

void BM_MakeAndLower(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  for (auto _ : state) benchmark::DoNotOptimize(with_communication(make_schedule(s.kind, s.ranks, s.microbatches, s.chunks)));
  set_label(state, s);
}

void BM_Validate(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const Schedule schedule = with_communication(make_schedule(s.kind, s.ranks, s.microbatches, s.chunks));
  for (auto _ : state) {
    const ValidationResult r = validate(schedule);
    if (!r.ok) state.SkipWithError("schedule does not validate");
    benchmark::DoNotOptimize(r);
  }
  set_label(state, s);
}

void BM_RenderGrid(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const Schedule schedule = with_communication(make_schedule(s.kind, s.ranks, s.microbatches, s.chunks));
  const ValidationResult r = validate(schedule);
  for (auto _ : state) benchmark::DoNotOptimize(render_grid(schedule, r));
  set_label(state, s);
}

void BM_SimulatedBubble(benchmark::State& state) {
  const Shape& s = kShapes[state.range(0)];
  const Schedule schedule = make_schedule(s.kind, s.ranks, s.microbatches, s.chunks);
  for (auto _ : state) benchmark::DoNotOptimize(simulated_bubble_fraction(schedule));
  set_label(state, s);
}

BENCHMARK(BM_MakeAndLower)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Validate)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RenderGrid)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SimulatedBubble)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpipe

BENCHMARK_MAIN();
