"""The GPU check's logic, tested on CPU: the HP/BE log parser, torch_under_shim's comparison of a
run with and without the shim, and its CPU phases (deterministic digests, graph phase skipped),
nccl_under_shim's latency verdict."""
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import shim_counters  # noqa: E402

NO_SHIM = "orion_scheduler=not-loaded hp_iterations=200 be_kernels_per_hp=4\n" \
          "hp_latency_us median=800.0 p90=900.0 p99=990.0 max=1200.0\nwall_ms=500.0 results=ok (0 mismatches)\n"


def run(*args, timeout=120):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout)


class HpBeRatioTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def ratio(self, shim_log: str):
        (self.dir / "n.log").write_text(NO_SHIM)
        (self.dir / "s.log").write_text(shim_log)
        return run(ROOT / "scripts/gpu/hp_be_ratio.py", self.dir / "n.log", self.dir / "s.log")

    def test_shorter_hp_latency_passes_with_the_ratio(self):
        out = self.ratio(NO_SHIM.replace("not-loaded", "on").replace("median=800.0", "median=200.0"))
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("ratio shim/no-shim=0.250", out.stdout)

    def test_longer_hp_latency_fails(self):
        out = self.ratio(NO_SHIM.replace("not-loaded", "on").replace("median=800.0", "median=1000.0"))
        self.assertEqual(out.returncode, 1, out.stdout)

    def test_shim_not_active_or_wrong_results_is_an_error(self):
        self.assertEqual(self.ratio(NO_SHIM).returncode, 2)
        wrong = NO_SHIM.replace("not-loaded", "on").replace("results=ok", "results=WRONG")
        out = self.ratio(wrong)
        self.assertEqual(out.returncode, 2)
        self.assertIn("results=WRONG", out.stdout)


    def test_several_runs_per_side_compare_their_median_medians(self):
        # One noisy no-shim run (46 us, as on the H100) must not decide the verdict alone.
        logs = {}
        for name, text in [("n1", NO_SHIM.replace("median=800.0", "median=230.0")),
                           ("n2", NO_SHIM.replace("median=800.0", "median=460.0")),
                           ("n3", NO_SHIM.replace("median=800.0", "median=240.0")),
                           ("s1", NO_SHIM.replace("not-loaded", "on").replace("median=800.0", "median=250.0")),
                           ("s2", NO_SHIM.replace("not-loaded", "on").replace("median=800.0", "median=255.0")),
                           ("s3", NO_SHIM.replace("not-loaded", "on").replace("median=800.0", "median=900.0")),
                           ("a1", NO_SHIM.replace("be_kernels_per_hp=4", "be_kernels_per_hp=0")
                            .replace("median=800.0", "median=200.0"))]:
            logs[name] = self.dir / f"{name}.log"
            logs[name].write_text(text)
        out = run(ROOT / "scripts/gpu/hp_be_ratio.py", "--no-shim", logs["n1"], logs["n2"], logs["n3"],
                  "--shim", logs["s1"], logs["s2"], logs["s3"], "--alone", logs["a1"])
        self.assertEqual(out.returncode, 0, out.stdout)  # 255 / 240: the one slow run on each side is ignored
        self.assertIn("ratio shim/no-shim=1.062", out.stdout)
        self.assertIn("shim/alone 1.275", out.stdout)
        self.assertIn("medians of 3 runs each", out.stdout)

    def test_one_log_pair_and_flags_cannot_be_mixed(self):
        (self.dir / "n.log").write_text(NO_SHIM)
        out = run(ROOT / "scripts/gpu/hp_be_ratio.py", self.dir / "n.log", "--shim", self.dir / "n.log")
        self.assertEqual(out.returncode, 2)


class TorchUnderShimTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.tmp.name)
        cls.program = HERE / "torch_under_shim.py"

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write(self, name, doc):
        path = self.dir / name
        path.write_text(json.dumps(doc))
        return path

    def test_cpu_phases_are_deterministic_and_graph_needs_a_gpu(self):
        digests = []
        for i in range(2):
            path = self.dir / f"cpu{i}.json"
            out = run(self.program, "--device", "cpu", "--phases", "cudnn_conv,cuda_graph_replay,nccl_allreduce",
                      "--output", path)
            self.assertEqual(out.returncode, 0, out.stderr[-2000:])
            doc = json.loads(path.read_text())
            self.assertFalse(doc["shim_loaded"])
            self.assertIn("needs a CUDA device", doc["phases"]["cuda_graph_replay"]["skipped"])
            digests.append({k: v.get("sha256") for k, v in doc["phases"].items()})
        self.assertEqual(digests[0], digests[1])
        self.assertEqual(len(digests[0]["cudnn_conv"]), 64)

    def test_compare_needs_equal_results_and_matching_counts(self):
        no_shim = {"shim_loaded": False, "phases": {"k": {"sha256": "a", "profiler_kernels": 10},
                                                     "g": {"sha256": "b", "profiler_kernels": 6}}}
        shim = {"shim_loaded": True, "phases": {
            "k": {"sha256": "a", "profiler_kernels": 10, "shim_kernel_launches": 10, "shim_graph_launches": 0,
                  "count_ok": True},
            "g": {"sha256": "b", "profiler_kernels": 6, "shim_kernel_launches": 0, "shim_graph_launches": 3,
                  "count_ok": True}}}
        a = self.write("a.json", no_shim)
        ok = run(self.program, "--compare", a, self.write("b.json", shim))
        self.assertEqual(ok.returncode, 0, ok.stdout)
        shim["phases"]["g"]["sha256"] = "c"
        differ = run(self.program, "--compare", a, self.write("c.json", shim))
        self.assertEqual(differ.returncode, 1)
        self.assertIn("g: results differ", differ.stdout)
        shim["phases"]["g"]["sha256"] = "b"
        shim["phases"]["k"].update(shim_kernel_launches=9, count_ok=False)
        miscount = run(self.program, "--compare", a, self.write("d.json", shim))
        self.assertEqual(miscount.returncode, 1)
        self.assertIn("shim 9 kernels", miscount.stdout)
        neither = run(self.program, "--compare", a, a)
        self.assertEqual(neither.returncode, 1)
        self.assertIn("neither run had the shim loaded", neither.stdout)

    def test_timing_gives_each_phase_and_all_against_the_reference(self):
        ref = self.write("r.json", {"phases": {"k": {"ms_per_run": 2.0}, "g": {"ms_per_run": 8.0},
                                               "n": {"skipped": "needs a CUDA device"}}})
        other = self.write("o.json", {"phases": {"k": {"ms_per_run": 2.1}, "g": {"ms_per_run": 8.0},
                                                 "n": {"skipped": "needs a CUDA device"}}})
        out = run(self.program, "--timing", ref, other)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("all phases 1.010 (10.10 vs 10.00 ms per round); k 1.050, g 1.000", out.stdout)
        untimed = self.write("u.json", {"phases": {"k": {"sha256": "a"}, "g": {"ms_per_run": 8.0}}})
        self.assertEqual(run(self.program, "--timing", ref, untimed).returncode, 2)

    def test_no_shim_in_this_process(self):
        self.assertFalse(shim_counters.shim_is_loaded())
        self.assertIsNone(shim_counters.ShimCounters.if_loaded())
        self.assertEqual(shim_counters.delta({"kernel": 12, "copy": 3}, {"kernel": 2, "copy": 3}), {"kernel": 10})


def nccl_result(shim: bool, hp_load_ms: float, be_max_wait_us=None, active=None, world_size=2):
    """A nccl_under_shim.py result with the same medians for both ops."""
    phases = {}
    for op in ("sum", "avg"):
        phases[f"{op}/no_load"] = {"n": 20, "median_ms": 0.05}
        phases[f"{op}/hp_load"] = {"n": 20, "median_ms": hp_load_ms}
        if shim:
            phases[f"{op}/hp_load"]["shim"] = {"deferred": 3, "forced_by_starvation": 1, "communication_streams": 0}
    return {"shim_loaded": shim, "shim_active": shim if active is None else active,
            "be_max_wait_us": be_max_wait_us, "phases": phases, "world_size": world_size}


class NcclUnderShimCompareTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        (self.dir / "no_shim.json").write_text(json.dumps(nccl_result(False, 0.5)))
        (self.dir / "no_shim_1.json").write_text(json.dumps(nccl_result(False, 0.5, world_size=1)))

    def tearDown(self):
        self.tmp.cleanup()

    def compare(self, shim_doc):
        (self.dir / "shim.json").write_text(json.dumps(shim_doc))
        return run(HERE / "nccl_under_shim.py", "--compare", self.dir / "no_shim.json", self.dir / "shim.json")

    def test_within_the_bound_passes(self):
        out = self.compare(nccl_result(True, 5.9, be_max_wait_us=200000))  # bound 10 x 0.5 + 1 = 6 ms
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("sum with HP load: median 5.900 ms shim vs 0.500 ms no shim (bound 6.000", out.stdout)

    def test_an_all_reduce_held_back_by_the_policy_fails(self):
        out = self.compare(nccl_result(True, 201.0, be_max_wait_us=200000))
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("waited: avg", out.stdout)

    def test_a_bound_above_the_starvation_bound_is_inconclusive(self):
        out = self.compare(nccl_result(True, 0.6, be_max_wait_us=5000))
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("inconclusive", out.stdout)

    def test_one_rank_gives_figures_but_no_verdict(self):
        # One rank: NCCL launches no communication kernel (H100: 400 ms held for sum at 200 ms).
        (self.dir / "shim.json").write_text(json.dumps(nccl_result(True, 400.3, be_max_wait_us=200000, world_size=1)))
        out = run(HERE / "nccl_under_shim.py", "--compare", self.dir / "no_shim_1.json", self.dir / "shim.json")
        self.assertEqual(out.returncode, 3, out.stdout)
        self.assertIn("no verdict with one rank", out.stdout)
        self.assertIn("median 400.300 ms shim", out.stdout)

    def test_world_size_beyond_the_gpus_is_refused(self):
        out = run(HERE / "nccl_under_shim.py", "--world-size", "0")
        self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
        self.assertIn("--world-size must be >= 1", out.stderr)

    def test_two_ranks_run_as_two_processes_that_each_need_a_gpu(self):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        env["CUDA_VISIBLE_DEVICES"] = ""
        out = subprocess.run([sys.executable, str(HERE / "nccl_under_shim.py"), "--world-size", "2",
                              "--output", str(self.dir / "r.json")], capture_output=True, text=True,
                             timeout=120, env=env)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertEqual(out.stderr.count("this check needs one"), 2, out.stderr)  # both ranks ran
        self.assertFalse((self.dir / "r.json").exists())

    def test_runs_without_the_shim_scheduling_are_unusable(self):
        out = self.compare(nccl_result(True, 0.6, be_max_wait_us=200000, active=False))
        self.assertEqual(out.returncode, 2, out.stdout)
        self.assertIn("without the shim scheduling", out.stdout)


def kineto_trace(kernels):
    """A Kineto-shaped trace: per kernel (start, end, stream, backward?), a launch on thread 1
    inside an aten op, itself inside an autograd backward node when the kernel is backward."""
    events = []
    for i, (start, end, stream, backward) in enumerate(kernels):
        launch = 1000 + 10 * i
        if backward:
            events.append({"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0",
                           "tid": 1, "ts": launch - 3, "dur": 8})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": launch - 1, "dur": 4})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": launch,
                       "dur": 1, "args": {"correlation": i}})
        events.append({"ph": "X", "cat": "kernel", "name": f"k{i}", "tid": 7, "ts": start, "dur": end - start,
                       "args": {"correlation": i, "stream": stream}})
    return {"traceEvents": events}


class KernelOverlapTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def overlap(self, kernels):
        path = self.dir / "t.json"
        path.write_text(json.dumps(kineto_trace(kernels)))
        out = run(ROOT / "scripts/gpu/kernel_overlap.py", path, "--json", self.dir / "r.json")
        return out, (json.loads((self.dir / "r.json").read_text()) if (self.dir / "r.json").exists() else None)

    def test_forward_and_backward_on_two_streams_overlap(self):
        # F [0,10) on stream 7, B [5,15) on stream 8, F [20,25): busy 20, both at once 5.
        out, r = self.overlap([(0, 10, 7, False), (5, 15, 8, True), (20, 25, 7, False)])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual((r["kernels"], r["backward_kernels"], r["streams"]), (3, 1, 2))
        self.assertAlmostEqual(r["busy_ms"], 0.020)
        self.assertAlmostEqual(r["concurrent_share"], 0.25)
        self.assertAlmostEqual(r["fb_overlap_share"], 0.25)
        self.assertIn("fb_overlap_share=0.250", out.stdout)

    def test_two_forwards_overlap_but_are_not_forward_backward(self):
        out, r = self.overlap([(0, 10, 7, False), (5, 15, 8, False)])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertAlmostEqual(r["concurrent_share"], 5 / 15)
        self.assertEqual(r["fb_overlap_share"], 0.0)

    def test_serial_kernels_do_not_overlap(self):
        out, r = self.overlap([(0, 10, 7, False), (10, 20, 8, True)])
        self.assertEqual(r["concurrent_share"], 0.0)
        self.assertEqual(r["fb_overlap_share"], 0.0)
        self.assertAlmostEqual(r["busy_ms"], 0.020)

    def test_a_trace_without_kernels_fails(self):
        out, r = self.overlap([])
        self.assertEqual(out.returncode, 1)
        self.assertIn("no GPU kernel", out.stderr)


def replay_json(shim_active=True, drop=None):
    """What `orion-replay-gpu --simulate --json` writes, reduced to what replay_summary.py reads."""
    def run(label, p99, exec_p99, be, lag, err):
        return {"label": label, "shim_active": label != "no-shim" and shim_active,
                "gpu": {"name": "NVIDIA H100", "sm_count": 132},
                "together": {"ops_completed": 10, "requests": [{"request": "r0"}]},
                "row": {"hp_p99_ms": p99, "hp_exec_p99_ms": exec_p99, "be_requests_per_s": be},
                "issue_lag_p99_us": lag,
                "relative_error": {"hp_p99": err, "be_requests_per_s": -err}}
    runs = [run("no-shim", 2.0, 1.5, 40.0, 3.2, 0.1), run("orion", 1.1, 0.8, 30.0, 41.0, -0.05)]
    return {"alone": {"row": {"hp_p99_ms": 1.0, "hp_exec_p99_ms": 0.5, "be_requests_per_s": 50.0}},
            "runs": [r for r in runs if r["label"] != drop]}


class ReplaySummaryTest(unittest.TestCase):
    def summary(self, data):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "replay.json"
            path.write_text(json.dumps(data))
            return run(ROOT / "scripts/gpu/replay_summary.py", path, "--policies", "orion")

    def test_ratios_to_alone_and_simulator_error_per_run(self):
        out = self.summary(replay_json())
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("NVIDIA H100 132 SMs", out.stdout)
        self.assertIn("no-shim HP p99 2.00x (exec 3.00x) BE 0.80x lag p99 3 us (sim err p99 +10%, BE -10%)", out.stdout)
        self.assertIn("orion HP p99 1.10x (exec 1.60x) BE 0.60x lag p99 41 us (sim err p99 -5%, BE +5%)", out.stdout)

    def test_missing_run_or_shim_not_scheduling_is_an_error(self):
        out = self.summary(replay_json(drop="orion"))
        self.assertEqual(out.returncode, 2)
        self.assertIn("runs missing: orion", out.stdout)
        out = self.summary(replay_json(shim_active=False))
        self.assertEqual(out.returncode, 2)
        self.assertIn("not scheduling", out.stdout)



class TraceDigestTest(unittest.TestCase):
    """scripts/gpu/trace_digest.py on a hand-made trace whose answers are known."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def digest(self, events):
        (self.dir / "t.json").write_text(json.dumps({"traceEvents": events}))
        out = run(ROOT / "scripts/gpu/trace_digest.py", self.dir / "t.json", "--json", self.dir / "d.json")
        return out, (json.loads((self.dir / "d.json").read_text()) if out.returncode == 0 else None)

    def test_busy_share_idle_gap_and_what_the_threads_were_in(self):
        events = [
            {"ph": "X", "cat": "kernel", "name": "a", "ts": 0, "dur": 1000, "tid": 7},
            {"ph": "X", "cat": "kernel", "name": "b", "ts": 500, "dur": 500, "tid": 8},
            {"ph": "X", "cat": "gpu_memcpy", "name": "c", "ts": 3000, "dur": 1000, "tid": 7},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 1000, "dur": 1900, "tid": 1},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 5, "tid": 2},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500, "tid": 2},
            {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 100, "dur": 100, "tid": 2},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 3500, "dur": 500, "tid": 2},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "thread 1 (rank1)"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "rank0"}},
        ]
        out, d = self.digest(events)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertAlmostEqual(d["gpu"]["busy_ms"], 2.0)
        self.assertAlmostEqual(d["gpu"]["span_ms"], 4.0)
        gap = d["gpu"]["longest_idle_gaps"][0]
        self.assertAlmostEqual(gap["ms"], 2.0)
        self.assertEqual(gap["threads_in"], {"1 (rank1)": ["cudaStreamSynchronize"]})
        sync = next(r for r in d["runtime"] if r["name"] == "cudaStreamSynchronize")
        self.assertAlmostEqual(sync["total_ms"], 1.9)
        thread = next(r for r in d["threads"] if r["tid"] == "2 (rank0)")
        self.assertAlmostEqual(thread["span_ms"], 4.0)
        self.assertEqual([n for n, _ in thread["top_cuda_calls_ms"]], ["cudaLaunchKernel"])
        self.assertAlmostEqual(thread["top_cuda_calls_ms"][0][1], 0.005)
        self.assertAlmostEqual(thread["in_ops_share"], 0.25)  # nested addmm is not counted twice
        self.assertEqual(d["ops"][0], {"name": "aten::mm", "count": 2, "total_ms": 1.0})
        self.assertIn("idle 2.00 ms at 1.0 ms (tid 1 (rank1): cudaStreamSynchronize)", out.stdout)
        self.assertIn("tid 2 (rank0): 4.0, 25.0% (3 ops); cudaLaunchKernel 0.0 ms", out.stdout)

    def test_a_trace_without_gpu_work_fails(self):
        out, _ = self.digest([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5, "tid": 1}])
        self.assertEqual(out.returncode, 1)
        self.assertIn("no GPU kernel", out.stderr)


class SdpaThreadsTest(unittest.TestCase):
    """tests/gpu/sdpa_threads.py's CPU smoke run: every CPU kernel measured, JSON and lines agree."""

    def test_cpu_run_measures_auto_and_each_cpu_kernel(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = run(HERE / "sdpa_threads.py", "--device", "cpu", "--fresh-threads", "2", "--warm-calls", "2",
                      "--output", Path(tmp) / "s.json")
            self.assertEqual(out.returncode, 0, out.stderr)
            doc = json.loads((Path(tmp) / "s.json").read_text())
        self.assertEqual([r["setting"] for r in doc["results"]], ["auto", "flash", "math", "control: linear"])
        for r in doc["results"]:
            self.assertTrue(r["runnable"], r)
            self.assertEqual(len(r["forward_fresh_thread_first_all_ms"]), 2)
            self.assertGreater(r["forward_warm_ms"], 0)
        self.assertEqual([r["kernel"] for r in doc["results"][1:]], ["flash", "math", "gemm"])
        lines = out.stdout.splitlines()
        self.assertEqual(len(lines), 4)
        self.assertTrue(lines[2].startswith("math (kernel math): forward on a fresh thread"), lines[2])
        self.assertTrue(lines[3].startswith("control: linear (kernel gemm): forward on a fresh thread"), lines[3])

    def test_fresh_threads_bind_the_device_by_index(self):
        # torch.cuda.set_device refuses a device without an index ("cuda"): the script gives it one.
        sys.path.insert(0, str(HERE))
        import sdpa_threads
        from unittest import mock
        with mock.patch("torch.cuda.current_device", return_value=0):
            self.assertEqual(sdpa_threads.cuda_device("cuda"), sdpa_threads.torch.device("cuda", 0))
        self.assertEqual(sdpa_threads.cuda_device("cuda:1").index, 1)
        bound = []
        with mock.patch("torch.cuda.set_device", side_effect=bound.append):
            self.assertEqual(sdpa_threads.in_fresh_thread(lambda: 7, sdpa_threads.torch.device("cuda", 1)), 7)
        self.assertEqual(bound, [1])

    def test_cuda_without_a_gpu_is_refused_by_name(self):
        import torch
        if torch.cuda.is_available():
            self.skipTest("a GPU is visible: the refusal is for machines without one")
        out = run(HERE / "sdpa_threads.py")
        self.assertEqual(out.returncode, 2)
        self.assertIn("torch sees no CUDA device (use --device cpu", out.stderr)


class TrainerSummaryTest(unittest.TestCase):
    """scripts/gpu/trainer_summary.py (check d's table) on hand-made run folders."""

    def write_run(self, root: Path, name: str, step_ms: float, attention: str = "cudnn", loss: float = 4.0):
        d = root / name
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({
            "tokens_per_step": 1000, "stages": 4, "schedule": "1f1b", "attention": attention, "step_time_ms_first": 999.0,
            "bubble_fraction": 0.2, "bubble_clock": "cuda_events", "peak_memory_bytes": 100,
            "flops_per_token": 1e6, "peak_flops_per_gpu": 1e12, "num_gpus": 1, "alloc_retries": 0}))
        steps = [{"step_time_ms": 999.0 if i < 2 else step_ms, "loss": 5.0 if i == 0 else loss, "device_mallocs": 3 if i == 0 else 0}
                 for i in range(5)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))

    def test_rows_name_the_attention_kernel_and_ratios_use_timed_steps(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            for name in ("async", "naive", "async_rank_stream", "async_shim", "async_shim_priority",
                         "async_shim_partition", "one_stage", "zb_h1"):
                self.write_run(root, name, 100.0 if name != "naive" else 50.0)
            (root / "eager.json").write_text(json.dumps({
                "peer": "pytorch_eager", "tokens_per_s": 5000.0, "step_time_ms_mean": 200.0, "first_loss": 5.0,
                "final_loss": 4.0, "steps": 4, "precision": "bf16", "attention": "cudnn", "threads": 1}) + "\n")
            out = run(ROOT / "scripts/gpu/trainer_summary.py", root, "--warmup", "2")
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            self.assertIn("| d: trainer ours async_threaded | INFO | 10000 tokens/s", out.stdout)
            self.assertIn("attention cudnn", out.stdout)
            self.assertIn("first step 999.0 ms;", out.stdout)
            self.assertIn("cudaMalloc in the timed steps 0", out.stdout)
            self.assertIn("| d: ratio ours async_threaded / ours naive | INFO | 0.500 (tokens/s) |", out.stdout)
            self.assertIn("| d: trainer PyTorch eager | INFO | 5000 tokens/s", out.stdout)
            # A run that wrote nothing fails the table, naming it.
            import shutil
            shutil.rmtree(root / "naive")
            out = run(ROOT / "scripts/gpu/trainer_summary.py", root, "--warmup", "2")
            self.assertEqual(out.returncode, 1)
            self.assertIn("| d: trainer ours naive | FAIL | gpipe_runner wrote no", out.stdout)


class ColocationSummaryTest(unittest.TestCase):
    """scripts/gpu/colocation_summary.py (check j) on made-up runs: the job's rate is taken over the
    pipeline's timed steps only, a job that did not run through them compares nothing, and a
    managed mode must show the gating at work."""

    T0 = 1_800_000_000.0  # the pipeline's first step ends here (Unix seconds)

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def pipeline(self, mode, step_ms):
        d = self.dir / f"pipeline_{mode}"
        d.mkdir()
        lines = [{"step": i, "step_time_ms": step_ms, "end_unix_s": self.T0 + i * step_ms / 1e3} for i in range(6)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))

    def job(self, mode, per_bucket, start=None, buckets=200, **extra):
        """A job of `buckets` 0.1 s intervals from `start` (default 5 s before the pipeline's first
        step ends), `per_bucket` completions each, but 1000 in the intervals before the timed steps
        (steps 2..5 start at T0 + 1 s with 1 s steps): a rate over the whole job would show them."""
        start = self.T0 - 5 if start is None else start
        timed_start = self.T0 + 1.0
        counts = [1000 if start + i * 0.1 < timed_start else per_bucket for i in range(buckets)]
        j = {"matmuls_per_s": 12345.0, "start_unix_s": start, "bucket_s": 0.1, "completions": counts, **extra}
        (self.dir / f"job_{mode}.json").write_text(json.dumps(j))

    def status(self, mode, windows, admitted):
        snap = {"clients": [{"role": "pipeline"}, {"role": "best_effort", "launches_admitted": admitted}],
                "pipeline": {"windows_published": windows, "filled_share": 0.25}}
        (self.dir / f"status_{mode}.jsonl").write_text("not json (the daemon starting)\n" + json.dumps(snap) + "\n")

    def summary(self):
        return run(ROOT / "scripts/gpu/colocation_summary.py", self.dir)

    def alone(self):
        self.pipeline("alone", 1000.0)
        (self.dir / "job_alone.json").write_text(json.dumps({"matmuls_per_s": 100.0}))

    def test_rates_over_the_timed_steps_and_the_gating_shown(self):
        self.alone()
        self.pipeline("unmanaged", 1000.0)
        self.job("unmanaged", 5)
        self.pipeline("managed", 1000.0)
        self.job("managed", 8, shim_loaded=True, shim_stats={"deferred": 42, "holding_stopped": 0})
        self.status("managed", windows=30, admitted=900)
        out = self.summary()
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("| j: colocation unmanaged | INFO | pipeline step 1000.0 ms / alone 1000.0 ms = 1.000; "
                      "job 50.0 matmuls/s (during the timed steps) / alone 100.0 = 0.500 |", out.stdout)
        self.assertIn("job 80.0 matmuls/s (during the timed steps) / alone 100.0 = 0.800; gpud: 30 windows, "
                      "900 launches admitted, filled share 0.250; shim deferred 42 |", out.stdout)
        self.assertNotIn("mps", out.stdout)

    def test_a_job_that_ended_before_the_timed_steps_compares_nothing(self):
        self.alone()
        self.pipeline("unmanaged", 1000.0)
        self.job("unmanaged", 5, buckets=40)  # 4 s: gone before the pipeline's third step
        out = self.summary()
        self.assertEqual(out.returncode, 1)
        self.assertIn("| j: colocation unmanaged | FAIL | the job ran", out.stdout)
        self.assertIn("not through them", out.stdout)

    def test_a_managed_job_the_shim_never_held_is_not_shown_gated(self):
        self.alone()
        self.pipeline("managed", 1000.0)
        self.job("managed", 8, shim_loaded=True, shim_stats={"deferred": 0, "holding_stopped": 1})
        self.status("managed", windows=0, admitted=0)
        out = self.summary()
        self.assertEqual(out.returncode, 1)
        for why in ("the shim stopped holding work", "held back none of the job's launches",
                    "the pipeline published no windows", "admitted none of the job's launches"):
            self.assertIn(why, out.stdout)
        (self.dir / "status_managed.jsonl").unlink()
        self.job("managed", 8, shim_loaded=False, shim_stats=None)
        out = self.summary()
        self.assertIn("ran without libgpu_scheduler.so", out.stdout)
        self.assertIn("no daemon status showed the pipeline and the job attached together (0 polled)", out.stdout)

    def test_a_missing_alone_run_fails_by_name(self):
        self.pipeline("unmanaged", 1000.0)
        self.job("unmanaged", 5)
        out = self.summary()
        self.assertEqual(out.returncode, 1)
        self.assertIn("| j: colocation alone | FAIL | pipeline_alone/metrics.jsonl", out.stdout)


if __name__ == "__main__":
    unittest.main()
