"""Multi-process runs of gpipe_runner on CPU (Gloo): equality with the in-process pipeline for
every schedule and for replicated stages (parallel.data_parallel_size), the launchers (built-in --nproc-per-node and torchrun --no-python), checkpoint and
resume, and each fault a cluster has (a killed rank, a port in use, an unreachable master, a
missing peer, ranks with different configs, a truncated or foreign checkpoint).

Usage: distributed_test.py GPIPE_RUNNER REPO_ROOT [unittest args]
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

RUNNER = ""
ROOT = ""

# A small GPT that runs a step in well under a second on one core per rank.
TINY = [
    "--set", "model.hidden_size=64", "--set", "model.num_layers=4", "--set", "model.num_heads=4",
    "--set", "model.sequence_length=32", "--set", "dataset.batch_size=8",
    "--set", "training.num_microbatches=4", "--set", "training.learning_rate=0.002",
    "--set", "training.warmup_steps=2", "--set", "training.log_interval=1",
    "--set", "training.profile_iteration=-1", "--set", "training.exit_after_profile=false",
    "--set", "parallel.device=cpu",
]

# A small BERT (configs/bert_4stage.yaml) with one block per stage: stage 0 holds the embedding,
# stage 3 the MLM head whose decoder is the same (tied) weight; stage 0 recomputes its block.
def bert_args():
    return ["--config", os.path.join(ROOT, "configs/bert_4stage.yaml")] + TINY + [
        "--set", "parallel.partition_layers=[1,1,1,1]", "--set", "model.norm_position=post"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env():
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # same intra-op threads in every layout: bitwise-equal math
    for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
              "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID", "TORCHELASTIC_USE_AGENT_STORE"]:
        env.pop(k, None)
    return env


def read_metrics(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(folder):
    return [(m["step"], m["loss"], m["grad_norm"]) for m in read_metrics(folder)]


class Ranks:
    """WORLD_SIZE processes started by the test itself (so it can kill one)."""

    def __init__(self, world, args, port=None, env_extra=None, ranks=None, cwd=None):
        self.port = port or free_port()
        self.procs = {}
        self.logs = {}
        self.dir = tempfile.mkdtemp(prefix="gpipe_ranks_")
        for r in (ranks if ranks is not None else range(world)):
            env = base_env()
            env.update({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(self.port)})
            env.update((env_extra or {}).get(r, {}))
            log = open(os.path.join(self.dir, f"rank{r}.log"), "w+")
            self.logs[r] = log
            self.procs[r] = subprocess.Popen([RUNNER] + args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             cwd=(cwd or {}).get(r))

    def wait(self, timeout):
        codes = {}
        deadline = time.time() + timeout
        for r, p in self.procs.items():
            try:
                codes[r] = p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                codes[r] = None
        return codes

    def log(self, r):
        self.logs[r].flush()
        with open(self.logs[r].name) as f:
            return f.read()

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in self.logs.values():
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class DistributedTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpipe_dist_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_runner(self, args, timeout=300, env=None, launcher=None):
        cmd = (launcher or []) + [RUNNER] + args
        p = subprocess.run(cmd, env=env or base_env(), capture_output=True, text=True, timeout=timeout)
        return p

    def in_process(self, name, extra):
        out = os.path.join(self.tmp, name)
        p = self.run_runner(["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY + extra +
                            ["--output-dir", out])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        return losses(out)

    def assert_same(self, a, b):
        self.assertEqual(len(a), len(b))
        for (sa, la, ga), (sb, lb, gb) in zip(a, b):
            self.assertEqual(sa, sb)
            self.assertAlmostEqual(la, lb, places=6, msg=f"loss at step {sa}")
            self.assertAlmostEqual(ga, gb, places=5, msg=f"gradient norm at step {sa}")

    def test_every_schedule_over_gloo_equals_in_process(self):
        cases = [
            ("gpipe", ["--schedule", "gpipe"], 2, []),
            ("1f1b", ["--schedule", "1f1b"], 4, []),
            ("1f1b_placed", ["--schedule", "1f1b"], 2, ["--placement", "[0,1,1,0]"]),
            ("interleaved", ["--schedule", "interleaved_1f1b", "--virtual-stages", "2", "--stages", "2"], 2, []),
            ("zb_h1", ["--schedule", "zb_h1"], 4, []),
            # Receives posted long before their compute (torch's lowering), both directions on
            # one pair of processes: each taken at the compute that needs it.
            ("zbv", ["--schedule", "zbv", "--virtual-stages", "2", "--stages", "2"], 2, []),
            ("naive", ["--schedule", "1f1b", "--scheduler", "naive"], 2, []),
        ]
        for name, extra, procs, placement in cases:
            with self.subTest(schedule=name, processes=procs):
                steps = ["--steps", "3"]
                reference = self.in_process(name + "_ref", extra + steps)
                out = os.path.join(self.tmp, name + "_mp")
                p = self.run_runner(["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY + extra +
                                    steps + placement + ["--output-dir", out, "--nproc-per-node", str(procs),
                                                         "--master-port", str(free_port())])
                self.assertEqual(p.returncode, 0, p.stderr[-3000:])
                self.assertIn("transport gloo", p.stderr + p.stdout)
                self.assert_same(reference, losses(out))

    def test_gloo_sends_are_let_go_once_the_step_is_over(self):
        # Each step sends every micro-batch's activation and gradient across the two processes
        # (about 0.5 MiB here). Gloo's send works hold their tensors until waited on: they used to
        # be kept to the run's end, so the memory in use grew by that every step.
        out = os.path.join(self.tmp, "gloo_sends")
        p = self.run_runner(["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY +
                            ["--set", "model.hidden_size=128", "--set", "model.sequence_length=64",
                             "--stages", "2", "--steps", "25", "--output-dir", out, "--nproc-per-node", "2",
                             "--master-port", str(free_port())])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        peaks = {m["step"]: m["peak_allocated_bytes"] for m in read_metrics(out)}
        grown = peaks[max(peaks)] - peaks[5]
        self.assertLess(grown, 2 << 20, f"memory in use grew {grown} bytes over steps 5..{max(peaks)}: {peaks}")

    def test_metrics_of_a_multi_process_run_cover_every_rank(self):
        # bubble_fraction is the mean over the replica's ranks, as rank_busy on the same line (it
        # was process 0's ranks only), and the peaks are the largest of any process's.
        out = os.path.join(self.tmp, "mp_metrics")
        p = self.run_runner(["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY +
                            ["--stages", "4", "--steps", "3", "--output-dir", out, "--nproc-per-node", "2",
                             "--master-port", str(free_port())])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        for m in read_metrics(out):
            self.assertEqual(len(m["rank_busy"]), 4)
            self.assertTrue(all(b > 0 for b in m["rank_busy"]), m["rank_busy"])
            mean_busy = sum(m["rank_busy"]) / len(m["rank_busy"])
            self.assertAlmostEqual(m["bubble_fraction"], 1 - mean_busy, places=9, msg=f"step {m['step']}")

    def test_bert_tied_embedding_over_gloo_equals_in_process(self):
        # The two copies of BERT's tied weight: in different processes (their gradients summed by
        # an all-reduce), in one process on different ranks ([0,1,1,0]: summed directly), four
        # processes. Losses and gradient norms (which count the tied weight once) match the
        # in-process run's; without the sum the embedding copy would train on half its gradient.
        steps = ["--steps", "3"]
        ref_out = os.path.join(self.tmp, "bert_ref")
        p = self.run_runner(bert_args() + steps + ["--output-dir", ref_out])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        reference = losses(ref_out)
        for name, procs, placement in [("split", 2, []), ("ends_together", 2, ["--placement", "[0,1,1,0]"]),
                                       ("four", 4, [])]:
            with self.subTest(case=name, processes=procs):
                out = os.path.join(self.tmp, "bert_" + name)
                p = self.run_runner(bert_args() + steps + placement +
                                    ["--output-dir", out, "--nproc-per-node", str(procs),
                                     "--master-port", str(free_port())])
                self.assertEqual(p.returncode, 0, p.stderr[-3000:])
                self.assert_same(reference, losses(out))

    def test_replicated_stages_equal_one_pipeline_at_the_same_global_batch(self):
        # parallel.data_parallel_size 2: two copies of a 2-stage pipeline, each running 2 of the
        # step's 4 micro-batches (rows 0-3 and 4-7 of the batch of 8), their gradients averaged
        # per stage over Gloo. Losses and gradient norms equal the single 2-stage pipeline's.
        # Layouts: both ranks of a replica in one process (2 processes), one rank per process
        # (4 processes), and buckets small enough that each stage's all-reduce is many buckets,
        # most started during the stage's last backward.
        steps = ["--steps", "3"]
        two_stages = ["--stages", "2", "--schedule", "1f1b"]
        reference = self.in_process("dp_ref", two_stages + steps)
        config = ["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY
        for name, procs, extra in [("colocated", 2, []), ("rank_per_process", 4, []),
                                   ("small_buckets", 4, ["--set", "parallel.dp_bucket_mb=0.01"])]:
            with self.subTest(layout=name, processes=procs):
                out = os.path.join(self.tmp, "dp_" + name)
                p = self.run_runner(config + two_stages + steps + extra +
                                    ["--data-parallel-size", "2", "--output-dir", out, "--nproc-per-node", str(procs),
                                     "--master-port", str(free_port())])
                self.assertEqual(p.returncode, 0, p.stderr[-3000:])
                log = p.stderr + p.stdout
                self.assertIn("replica 1 of 2 (2 of the 4 micro-batches per step)", log)
                self.assert_same(reference, losses(out))
                if name == "small_buckets":
                    self.assertRegex(log, r"stage 0: ranks 0 2 \((?:[2-9]|[1-9][0-9]+) buckets\)")
                    # The hooks started buckets while the stage's last backward still ran.
                    self.assertRegex(log, r"stage 0 replicas' gradient all-reduce: [1-9][0-9]* of [0-9]+ buckets "
                                          r"started during the last backward")

        # BERT, tied embedding across the replica's two processes and replicated: the tied sum runs
        # over the replica's processes only, the all-reduce over the stage's replicas.
        bert_ref = os.path.join(self.tmp, "dp_bert_ref")
        p = self.run_runner(bert_args() + steps + ["--output-dir", bert_ref])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        out = os.path.join(self.tmp, "dp_bert")
        p = self.run_runner(bert_args() + steps + ["--data-parallel-size", "2", "--output-dir", out,
                                                   "--nproc-per-node", "4", "--master-port", str(free_port())])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assert_same(losses(bert_ref), losses(out))

    def test_replicated_run_checkpoints_resume_in_another_layout(self):
        # Replica 0 writes the stage files; a run without replicas resumes them (the trajectory
        # does not depend on data_parallel_size) and continues exactly as the replicated run did.
        ckpt = ["--checkpoint-dir", os.path.join(self.tmp, "dp_ckpt"), "--set", "training.keep_checkpoints=0"]
        config = ["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY + ["--stages", "2"]
        out = os.path.join(self.tmp, "dp_ckpt_run")
        p = self.run_runner(config + ckpt + ["--steps", "4", "--checkpoint-interval", "2", "--data-parallel-size", "2",
                                             "--output-dir", out, "--nproc-per-node", "4",
                                             "--master-port", str(free_port())])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        folder = os.path.join(self.tmp, "dp_ckpt", "step_00000002")
        with open(os.path.join(folder, "manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual(sorted(s["stage"] for s in manifest["stages"]), [0, 1])
        resumed = os.path.join(self.tmp, "dp_resumed")
        p = self.run_runner(config + ckpt + ["--steps", "4", "--resume-from", folder, "--output-dir", resumed])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assert_same(losses(out)[2:], losses(resumed))

    def test_replicated_stages_with_dropout_equal_one_pipeline(self):
        # Dropout masks are seeded by each micro-batch's place in the step's global batch, so two
        # replicas running 2 micro-batches each draw the masks the single pipeline draws for its 4
        # (the replicas used to draw the same masks as each other: correlated noise).
        steps = ["--steps", "3"]
        common = ["--stages", "2", "--schedule", "1f1b", "--set", "model.dropout=0.2"]
        reference = self.in_process("dropout_ref", common + steps)
        undropped = self.in_process("dropout_none", ["--stages", "2", "--schedule", "1f1b"] + steps)
        self.assertNotAlmostEqual(reference[0][1], undropped[0][1], places=4, msg="dropout changed nothing")
        out = os.path.join(self.tmp, "dropout_dp")
        p = self.run_runner(["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY + common + steps +
                            ["--data-parallel-size", "2", "--output-dir", out, "--nproc-per-node", "2",
                             "--master-port", str(free_port())])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assert_same(reference, losses(out))

    def test_replicas_wait_for_a_slow_checkpoint(self):
        # Only replica 0 writes checkpoints. Replica 1 used to run on into the next step's gradient
        # all-reduce and give up after one peer timeout while replica 0 was still writing (a slow
        # shared filesystem); it now waits while replica 0 beats. Here every fsync of process 0
        # (replica 0) takes 1 s, several seconds per checkpoint, and the peer timeout is 2 s.
        source = os.path.join(self.tmp, "slow_fsync.c")
        with open(source, "w") as f:
            f.write("#include <unistd.h>\n#include <dlfcn.h>\n"
                    "int fsync(int fd) { sleep(1); int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, \"fsync\");"
                    " return real(fd); }\n")
        lib = os.path.join(self.tmp, "slow_fsync.so")
        built = subprocess.run(["cc", "-shared", "-fPIC", "-o", lib, source, "-ldl"], capture_output=True, text=True)
        self.assertEqual(built.returncode, 0, built.stderr)
        ranks = Ranks(2, self.common(os.path.join(self.tmp, "slow_ckpt"),
                                     ["--steps", "3", "--stages", "2", "--data-parallel-size", "2",
                                      "--checkpoint-interval", "1", "--peer-timeout", "2"]),
                      env_extra={0: {"LD_PRELOAD": lib}})
        try:
            codes = ranks.wait(timeout=240)
            for r in (0, 1):
                self.assertEqual(codes[r], 0, ranks.log(r)[-2000:])
        finally:
            ranks.close()

    def test_replicas_that_do_not_fit_the_launch_are_refused(self):
        config = ["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY + ["--stages", "2", "--steps", "1"]
        p = self.run_runner(config + ["--data-parallel-size", "2", "--output-dir", os.path.join(self.tmp, "dp_one")])
        self.assertEqual(p.returncode, 2, p.stderr[-2000:])
        self.assertIn("parallel.data_parallel_size=2 replicates the pipeline over processes, but this is one process",
                      p.stderr)
        p = self.run_runner(config + ["--data-parallel-size", "3", "--output-dir", os.path.join(self.tmp, "dp_three")])
        self.assertEqual(p.returncode, 2, p.stderr[-2000:])
        self.assertIn("does not split over parallel.data_parallel_size 3", p.stderr)
        p = self.run_runner(config + ["--data-parallel-size", "2", "--output-dir", os.path.join(self.tmp, "dp_odd"),
                                      "--nproc-per-node", "3", "--master-port", str(free_port())])
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("do not split into parallel.data_parallel_size=2", p.stderr + p.stdout)

    def test_torchrun_no_python_launches_the_runner_unchanged(self):
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        if not os.path.exists(torchrun):
            self.skipTest(f"SKIP: torchrun not found next to {sys.executable}")
        reference = self.in_process("ref", ["--steps", "2"])
        out = os.path.join(self.tmp, "torchrun")
        p = self.run_runner(["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY +
                            ["--steps", "2", "--output-dir", out],
                            launcher=[torchrun, "--no-python", "--nproc_per_node=2",
                                      f"--master_port={free_port()}"])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assert_same(reference, losses(out))
        # Replicated under torchrun: two replicas of a 2-stage pipeline, one process each.
        reference = self.in_process("ref_dp", ["--steps", "2", "--stages", "2"])
        out = os.path.join(self.tmp, "torchrun_dp")
        p = self.run_runner(["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY +
                            ["--steps", "2", "--stages", "2", "--data-parallel-size", "2", "--output-dir", out],
                            launcher=[torchrun, "--no-python", "--nproc_per_node=2",
                                      f"--master_port={free_port()}"])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assert_same(reference, losses(out))

    def common(self, out, extra=()):
        return (["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY +
                ["--output-dir", out, "--checkpoint-dir", os.path.join(self.tmp, "ckpt")] + list(extra))

    def test_killed_rank_stops_the_others_and_resume_equals_an_uninterrupted_run(self):
        # The trajectory fields (max_steps: the LR schedule) are equal in all three runs; the
        # uninterrupted reference stops after step 7 through profile_iteration.
        reference_out = os.path.join(self.tmp, "reference")
        p = self.run_runner(["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY +
                            ["--steps", "1000", "--output-dir", reference_out,
                             "--set", "training.profile_iteration=7", "--set", "training.exit_after_profile=true"])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        reference = losses(reference_out)
        self.assertEqual([s for s, _, _ in reference], list(range(8)))

        ranks = Ranks(4, self.common(os.path.join(self.tmp, "killed"),
                                     ["--steps", "1000", "--checkpoint-interval", "2", "--peer-timeout", "30",
                                      "--set", "training.keep_checkpoints=0"]))
        try:
            manifest = os.path.join(self.tmp, "ckpt", "step_00000004", "manifest.json")
            deadline = time.time() + 120
            while not os.path.exists(manifest) and time.time() < deadline:
                time.sleep(0.05)
            self.assertTrue(os.path.exists(manifest), ranks.log(0)[-3000:])
            ranks.procs[2].send_signal(signal.SIGKILL)
            killed_at = time.time()
            codes = ranks.wait(timeout=60)
            took = time.time() - killed_at
            self.assertEqual(codes[2], -signal.SIGKILL)
            for r in (0, 1, 3):
                self.assertIsNotNone(codes[r], f"rank {r} still runs {took:.0f} s after rank 2 was killed")
                self.assertNotEqual(codes[r], 0, ranks.log(r)[-2000:])
                self.assertIn("lost rank 2", ranks.log(r), ranks.log(r)[-2000:])
            self.assertLess(took, 30, "the other ranks must stop within parallel.peer_timeout_s")
        finally:
            ranks.close()
        self.assertTrue(os.path.exists(manifest))

        # Resume the killed run from the newest complete checkpoint (step 4 or later), on another
        # process layout (2 processes x 2 ranks): the stage files do not depend on it.
        resumed_out = os.path.join(self.tmp, "resumed")
        p = self.run_runner(self.common(resumed_out, ["--steps", "1000", "--resume-from",
                                                      os.path.dirname(manifest),
                                                      "--set", "training.profile_iteration=7",
                                                      "--set", "training.exit_after_profile=true",
                                                      "--nproc-per-node", "2", "--master-port", str(free_port())]))
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        resumed = losses(resumed_out)
        self.assertEqual([s for s, _, _ in resumed], [4, 5, 6, 7])
        self.assert_same(reference[4:], resumed)

        # --resume (newest) in one process gives the same steps again from the newest checkpoint.
        p = self.run_runner(self.common(os.path.join(self.tmp, "resumed_latest"),
                                        ["--steps", "1000", "--resume", "--set", "training.profile_iteration=9",
                                         "--set", "training.exit_after_profile=true"]))
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        latest = losses(os.path.join(self.tmp, "resumed_latest"))
        self.assertGreaterEqual(latest[0][0], 4)
        by_step = {s: (l, g) for s, l, g in reference}
        for s, l, g in latest:
            if s in by_step:
                self.assertAlmostEqual(l, by_step[s][0], places=6)

    def test_truncated_or_foreign_checkpoint_is_refused(self):
        out = os.path.join(self.tmp, "first")
        p = self.run_runner(self.common(out, ["--steps", "2", "--checkpoint-interval", "2"]))
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        folder = os.path.join(self.tmp, "ckpt", "step_00000002")
        # Another seed: a different trajectory, a foreign checkpoint.
        p = self.run_runner(self.common(os.path.join(self.tmp, "foreign"), ["--steps", "2", "--seed", "7", "--resume"]))
        self.assertEqual(p.returncode, 2, p.stderr[-2000:])
        self.assertIn("different configuration", p.stderr)
        stage_file = os.path.join(folder, "stage_1.pt")
        with open(stage_file, "r+b") as f:
            f.truncate(os.path.getsize(stage_file) - 7)
        p = self.run_runner(self.common(os.path.join(self.tmp, "truncated"), ["--steps", "2", "--resume"]))
        self.assertEqual(p.returncode, 2, p.stderr[-2000:])
        self.assertIn("truncated", p.stderr)
        self.assertIn("stage_1.pt", p.stderr)

    def test_port_in_use_is_named(self):
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            ranks = Ranks(2, self.common(os.path.join(self.tmp, "port"), ["--steps", "1", "--peer-timeout", "5"]),
                          port=port, ranks=[0])
            try:
                codes = ranks.wait(timeout=60)
                self.assertEqual(codes[0], 1, ranks.log(0)[-2000:])
                self.assertIn(f"MASTER_PORT={port} is already in use", ranks.log(0))
            finally:
                ranks.close()

    def test_unreachable_master_is_named(self):
        port = free_port()  # nobody listens there
        ranks = Ranks(2, self.common(os.path.join(self.tmp, "unreachable"), ["--steps", "1", "--peer-timeout", "3"]),
                      port=port, ranks=[1])
        try:
            codes = ranks.wait(timeout=60)
            self.assertEqual(codes[1], 1, ranks.log(1)[-2000:])
            self.assertIn(f"could not reach the rendezvous at 127.0.0.1:{port}", ranks.log(1))
        finally:
            ranks.close()

    def test_missing_peer_is_named(self):
        ranks = Ranks(3, self.common(os.path.join(self.tmp, "missing"), ["--steps", "1", "--peer-timeout", "3",
                                                                          "--stages", "3",
                                                                          "--set", "model.num_layers=3"]),
                      ranks=[0, 1])
        try:
            codes = ranks.wait(timeout=60)
            for r in (0, 1):
                self.assertEqual(codes[r], 1, ranks.log(r)[-2000:])
                self.assertIn("only 2 of 3 ranks joined", ranks.log(r))
                self.assertIn("missing rank 2", ranks.log(r))
        finally:
            ranks.close()

    def test_missing_rank_0_under_the_agent_store_is_named(self):
        # torchrun's agent hosts the store; rank 0 never starts. Rank 1 used to block on rank 0's
        # config hash for the store's whole timeout and then print the store's bare wait error.
        try:
            from torch.distributed import TCPStore
        except ImportError as e:
            self.skipTest(f"SKIP: this Python has no torch.distributed ({e}) to host an agent store")
        port = free_port()
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        ranks = Ranks(2, self.common(os.path.join(self.tmp, "no_rank0"), ["--steps", "1", "--peer-timeout", "3"]),
                      port=port, ranks=[1], env_extra={1: {"TORCHELASTIC_USE_AGENT_STORE": "True"}})
        try:
            codes = ranks.wait(timeout=60)
            self.assertNotIn(codes[1], (0, None), ranks.log(1)[-2000:])
            self.assertIn("missing rank 0", ranks.log(1))
        finally:
            ranks.close()
            del store

    def test_ranks_with_different_configs_are_refused(self):
        args = self.common(os.path.join(self.tmp, "mismatch"), ["--steps", "1", "--peer-timeout", "20"])
        port = free_port()
        ranks = Ranks(2, args, port=port, ranks=[0])
        other = Ranks(2, args + ["--lr", "0.5"], port=port, ranks=[1])
        try:
            codes = {**ranks.wait(timeout=60), **other.wait(timeout=60)}
            for r, log in ((0, ranks.log(0)), (1, other.log(1))):
                self.assertEqual(codes[r], 2, log[-2000:])
                self.assertIn("rank 0 and rank 1 run different configurations", log)
        finally:
            ranks.close()
            other.close()

    def test_ranks_that_loaded_different_data_are_refused(self):
        # The same config on both ranks, but each node's copy of the relative dataset.path holds
        # other text: stage 0's inputs and the last stage's targets would come from different
        # samples. The rank that differs from rank 0 names it (exit 2) and rank 0 stops with it.
        nodes = {}
        for r, text in ((0, "alpha beta gamma delta\n" * 200), (1, "epsilon zeta eta theta\n" * 150)):
            nodes[r] = os.path.join(self.tmp, f"node{r}")
            os.makedirs(os.path.join(nodes[r], "data"))
            with open(os.path.join(nodes[r], "data", "a.txt"), "w") as f:
                f.write(text)
        args = self.common(os.path.join(self.tmp, "datamismatch"),
                           ["--steps", "1", "--peer-timeout", "20", "--set", "dataset.name=text",
                            "--set", "dataset.path=data"])
        log = self.rank1_refuses_and_rank0_stops(args, nodes)
        self.assertIn("this process loaded other data than rank 0", log)
        self.assertIn("dataset.path 'data'", log)

    def rank1_refuses_and_rank0_stops(self, args, cwd):
        """Two ranks in their own working directories: rank 1 exits 2 and rank 0 stops with it.
        Returns rank 1's log."""
        ranks = Ranks(2, args, cwd=cwd)
        try:
            codes = ranks.wait(timeout=60)
            self.assertEqual(codes[1], 2, ranks.log(1)[-2000:])
            self.assertIsNotNone(codes[0], "rank 0 did not stop")
            self.assertNotEqual(codes[0], 0, ranks.log(0)[-2000:])
            return ranks.log(1)
        finally:
            ranks.close()

    def test_a_checkpoint_folder_the_ranks_do_not_share_is_refused_before_training(self):
        # A relative --checkpoint-dir from two working directories (node-local folders): named
        # before the first step by the rank that cannot see rank 0's probe file, not at the first
        # save hours in.
        nodes = {r: os.path.join(self.tmp, f"ckptnode{r}") for r in (0, 1)}
        for d in nodes.values():
            os.makedirs(d)
        args = (["--config", os.path.join(ROOT, "configs/gpt_cpu_tiny.yaml")] + TINY +
                ["--output-dir", os.path.join(self.tmp, "ckptshare"), "--checkpoint-dir", "ckpt",
                 "--checkpoint-interval", "1", "--steps", "2", "--peer-timeout", "20"])
        log = self.rank1_refuses_and_rank0_stops(args, nodes)
        self.assertIn("training.checkpoint_dir 'ckpt' is not the folder rank 0 writes", log)
        self.assertNotIn("step 1/", log)

    def test_a_mismatch_among_three_ranks_reaches_every_rank(self):
        # Ranks 0 and 1 agree, rank 2 does not: rank 1 must hear it from rank 0's verdict, not time
        # out connecting Gloo to a rank 0 that left.
        args = self.common(os.path.join(self.tmp, "mismatch3"), ["--steps", "1", "--peer-timeout", "20",
                                                                  "--stages", "3"])
        port = free_port()
        agree = Ranks(3, args, port=port, ranks=[0, 1])
        other = Ranks(3, args + ["--lr", "0.5"], port=port, ranks=[2])
        try:
            codes = {**agree.wait(timeout=60), **other.wait(timeout=60)}
            for r, log in ((0, agree.log(0)), (1, agree.log(1)), (2, other.log(2))):
                self.assertEqual(codes[r], 2, log[-2000:])
                self.assertIn("rank 0 and rank 2 run different configurations", log)
            self.assertNotIn("Gloo", agree.log(1))
        finally:
            agree.close()
            other.close()

    def test_two_processes_with_one_rank_are_refused(self):
        # A job script that gives two processes RANK=1 (rank 2 never comes): the second one to
        # claim rank 1 names the clash (exit 2) and posts it; rank 0 stops with it instead of
        # waiting out the timeout for rank 2, and nobody hangs.
        args = self.common(os.path.join(self.tmp, "dup"), ["--steps", "1", "--peer-timeout", "30",
                                                            "--stages", "3"])
        port = free_port()
        groups = [Ranks(3, args, port=port, ranks=[0]), Ranks(3, args, port=port, ranks=[1]),
                  Ranks(3, args, port=port, ranks=[1])]
        try:
            codes = [g.wait(timeout=25) for g in groups]
            logs = [g.log(r) for g, r in zip(groups, (0, 1, 1))]
            for code, log in zip(codes, logs):
                self.assertIsNotNone(list(code.values())[0], "a process hung:\n" + log[-2000:])
                self.assertNotEqual(list(code.values())[0], 0, log[-2000:])
            losers = [log for code, log in zip(codes[1:], logs[1:]) if code[1] == 2 and
                      "two processes were started as rank 1 of 3" in log]
            # The second claimant names the clash; the first may report it too (it read the
            # posted verdict) or that rank 0 left, depending on timing.
            self.assertGreaterEqual(len(losers), 1, "\n---\n".join(l[-1500:] for l in logs))
            self.assertIn("two processes were started as rank 1 of 3", logs[0])
        finally:
            for g in groups:
                g.close()

    def test_one_gpu_published_by_every_process_is_refused(self):
        # A fixed GPU UUID with publish_bubbles_rank=-1: every process would attach to that GPU's
        # daemon as its pipeline and all but one fail at start-up; refused by name before any
        # daemon is asked (none runs here).
        args = self.common(os.path.join(self.tmp, "pub"), ["--steps", "1", "--nproc-per-node", "2",
                                                           "--master-port", str(free_port()),
                                                           "--set", "parallel.publish_bubbles_gpu=GPU-x"])
        p = self.run_runner(args)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("parallel.publish_bubbles_gpu names one GPU (GPU-x) but 2 processes", p.stderr + p.stdout)

    def test_bad_launch_environment_is_a_usage_error(self):
        env = base_env()
        env.update({"RANK": "0"})  # WORLD_SIZE missing
        p = self.run_runner(self.common(os.path.join(self.tmp, "env"), ["--steps", "1"]), env=env)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("WORLD_SIZE", p.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    RUNNER, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)
