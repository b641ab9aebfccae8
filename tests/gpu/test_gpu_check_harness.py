"""scripts/gpu_check.sh's harness on CPU, with stand-in steps (GPU_CHECK_STEP_DIR): what comes back
from the GPU machine (results.md and logs.tar.gz only, refreshed after each step, no traces), the
time limit, processes that outlive their step (killed, and said so), a step without a row, and
scripts/gpu/check_outdir.py's rules for the returned folder. Also the three-call plan's shape."""
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "gpu_check.sh"
OUTDIR_RULES = ROOT / "scripts" / "gpu" / "check_outdir.py"
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
from rehearse import marked_processes as tagged_processes  # noqa: E402  (pids whose environment has a marker)

ROW = 'printf "| %s | %s | %s |\\n" "$NAME" "$STATUS" "$DETAIL" >>"$1/results.md"\n'
STANDINS = {
    # build: a row, a log, a trace that must not come back, and a log too big to come back.
    "build.sh": 'mkdir -p "$1/logs" "$1/trainer/run"; echo built >"$1/logs/build.log"\n'
                'head -c 2000 /dev/zero >"$1/trainer/run/host_1.pt.trace.json"\n'
                'head -c 2000000 /dev/zero >"$1/logs/huge.log"\n'
                'echo \'{"ok": 1}\' >"$1/trainer/run/summary.json"\n'
                'NAME=build STATUS=PASS DETAIL=stand-in; ' + ROW,
    # ctest: leaves a process behind in a session of its own (what an inner `timeout` or a
    # daemonising program does), then records its row.
    "ctest.sh": 'setsid sleep 300 </dev/null >/dev/null 2>&1 &\n'
                'NAME=ctest STATUS=PASS DETAIL=stand-in; ' + ROW,
    # a: exits without a row.
    "check_hp_be.sh": 'exit 3\n',
    # b: runs past its limit (the budget left), with a child that would outlive it.
    "check_torch_shim.sh": 'sleep 300 & sleep 300\n',
}


class GpuCheckHarness(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        base = Path(cls.tmp.name)
        steps = base / "steps"
        steps.mkdir()
        for name, body in STANDINS.items():
            (steps / name).write_text("#!/usr/bin/env bash\n" + body)
            (steps / name).chmod(0o755)
        cls.out = base / "out"
        cls.marker = f"GPU_HARNESS_TEST={os.getpid()}"
        env = dict(os.environ, GPU_CHECK_STEP_DIR=str(steps), GPU_CHECK_WORK=str(base / "work"),
                   GPU_CHECK_ONLY="build ctest a b c", GPU_CHECK_BUDGET_S="8", GPU_CHECK_MIN_STEP_S="2",
                   GPU_CHECK_COMMIT="abc1234", GPU_HARNESS_TEST=str(os.getpid()))
        start = time.monotonic()
        cls.proc = subprocess.run(["bash", str(CHECK), str(cls.out)], capture_output=True, text=True,
                                  env=env, timeout=120)
        cls.seconds = time.monotonic() - start
        cls.results = (cls.out / "results.md").read_text() if (cls.out / "results.md").exists() else ""

    @classmethod
    def tearDownClass(cls):
        for pid in tagged_processes(cls.marker):  # never leave the stand-ins' sleeps behind
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        cls.tmp.cleanup()

    def row(self, check):
        m = re.search(rf"^\| {re.escape(check)} \| (\w+) \| (.*) \|$", self.results, re.M)
        self.assertIsNotNone(m, f"no row for {check!r} in:\n{self.results}\n{self.proc.stdout}\n{self.proc.stderr}")
        return m.group(1), m.group(2)

    def test_only_the_table_and_the_log_archive_come_back(self):
        self.assertEqual(sorted(p.name for p in self.out.iterdir()), ["logs.tar.gz", "results.md"])
        rules = subprocess.run([sys.executable, str(OUTDIR_RULES), str(self.out)], capture_output=True, text=True)
        self.assertEqual(rules.returncode, 0, rules.stdout)
        with tarfile.open(self.out / "logs.tar.gz") as tar:
            names = {os.path.normpath(n) for n in tar.getnames()}
        self.assertIn("logs/build.log", names)
        self.assertIn("results.md", names)
        self.assertIn("trainer/run/summary.json", names)
        self.assertNotIn("trainer/run/host_1.pt.trace.json", names)  # traces stay behind
        self.assertNotIn("logs/huge.log", names)  # over 1 MiB

    def test_rows_say_what_each_step_did(self):
        self.assertIn("- Tree: abc1234 ;", self.results)
        self.assertEqual(self.row("build")[0], "PASS")
        self.assertEqual(self.row("ctest")[0], "PASS")
        status, detail = self.row("ctest: processes")
        self.assertEqual(status, "INFO")
        self.assertIn("1 process(es) of this step outlived it and were killed", detail)
        status, detail = self.row("a")
        self.assertEqual((status, "without a result row" in detail), ("FAIL", True), detail)
        status, detail = self.row("b")
        self.assertEqual(status, "FAIL")
        self.assertIn("timed out", detail)
        status, detail = self.row("c")
        self.assertEqual(status, "FAIL")
        self.assertIn("not run", detail)
        self.assertNotEqual(self.proc.returncode, 0)

    def test_no_process_outlives_its_step(self):
        self.assertEqual(tagged_processes(self.marker), [])
        self.assertLess(self.seconds, 60, "the budget of 8 s bounds the run")

    def test_the_three_calls_each_start_with_build_and_cover_every_check(self):
        text = CHECK.read_text()
        plan = dict(re.findall(r'^\s*\[(\d)\]="([^"]+)"', text, re.M))
        self.assertEqual(sorted(plan), ["1", "2", "3"])
        covered = []
        for call, checks in plan.items():
            self.assertEqual(checks.split()[0], "build", call)
            covered += checks.split()[1:]
        self.assertEqual(sorted(covered), sorted("ctest a b c d e f g h i j".split()))


class GpuCheckArguments(unittest.TestCase):
    """What gpu_check.sh refuses, it refuses before it makes OUT or empties the work folder."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.base = Path(self.tmp.name)
        self.work = self.base / "work"
        self.work.mkdir()
        (self.work / "last_run.log").write_text("the previous run's log\n")

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, *args, **env):
        return subprocess.run(["bash", str(CHECK), *args], capture_output=True, text=True, timeout=30,
                              env=dict(os.environ, GPU_CHECK_WORK=str(self.work), **env))

    def assert_untouched(self, out):
        self.assertTrue((self.work / "last_run.log").exists(), "a refused call emptied the work folder")
        self.assertFalse(out.exists(), f"a refused call made {out}")

    def test_help_prints_the_checks_and_runs_nothing(self):
        for flag in ("--help", "-h"):
            proc = self.check(flag)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("a  gpu_hp_be_kernels", proc.stdout)
            self.assertIn("GPU_CHECK_ONLY", proc.stdout)
            self.assert_untouched(self.base / flag)

    def test_bad_arguments_are_refused_before_anything_is_touched(self):
        out = self.base / "out"
        cases = [(("--call",), {}, "--call needs 1, 2 or 3"),
                 (("--call", "4", str(out)), {}, "--call: 1, 2 or 3 (got '4')"),
                 ((str(out),), {"GPU_CHECK_ONLY": "b zz"}, "unknown check 'zz'"),
                 (("--verbose",), {}, "looks like an option"),
                 ((str(self.work / "out"),), {}, "OUT must lie outside GPU_CHECK_WORK")]
        for args, env, message in cases:
            proc = self.check(*args, **env)
            self.assertEqual(proc.returncode, 2, (args, proc.stdout, proc.stderr))
            self.assertIn(message, proc.stderr, args)
            self.assert_untouched(out)
            self.assertFalse((self.work / "out").exists())


class CheckOutdirRules(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def rules(self, *extra):
        return subprocess.run([sys.executable, str(OUTDIR_RULES), str(self.out), *extra], capture_output=True, text=True)

    def test_a_good_folder_passes(self):
        (self.out / "results.md").write_text("x")
        (self.out / "a").mkdir()
        (self.out / "a" / "b").mkdir()
        (self.out / "a" / "b" / "two_down.txt").write_text("x")
        out = self.rules()
        self.assertEqual(out.returncode, 0, out.stdout)

    def test_each_rule_fails_naming_the_file(self):
        for i in range(9):
            (self.out / f"f{i}.log").write_text("x")
        deep = self.out / "a" / "b" / "c"
        deep.mkdir(parents=True)
        (deep / "three_down.log").write_text("x")
        with open(self.out / "big.bin", "wb") as f:
            f.truncate((16 << 20) + 1)
        (self.out / "link").symlink_to(self.out / "f0.log")
        (self.out / "odd name.log").write_text("x")
        out = self.rules()
        self.assertEqual(out.returncode, 1)
        for expected in ("files (at most 8", "three_down.log: 3 folders down", "big.bin: 16.0 MiB",
                         "link: a link", "odd name.log: a name with odd characters"):
            self.assertIn(expected, out.stdout)

    def test_only_names_the_files_allowed(self):
        (self.out / "results.md").write_text("x")
        (self.out / "stray.json").write_text("x")
        out = self.rules("--only", "results.md", "logs.tar.gz")
        self.assertEqual(out.returncode, 1)
        self.assertIn("stray.json: not one of the files", out.stdout)


class EnsureDeps(unittest.TestCase):
    """scripts/gpu/common.sh's ensure_deps on a bare copy: the staged .debs are unpacked into
    .deps/prefix, and a prefix unpacked from other .debs than those staged now is unpacked again,
    even when the copy kept no modification times (the .deb swapped under an older time)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)
        (self.root / "scripts" / "gpu").mkdir(parents=True)
        (self.root / "scripts" / "gpu" / "common.sh").write_text((ROOT / "scripts" / "gpu" / "common.sh").read_text())
        (self.root / ".deps" / "debs").mkdir(parents=True)

    def tearDown(self):
        self._tmp.cleanup()

    def stage(self, text):
        """A one-file package (usr/include/probe.h holding `text`) as .deps/debs/probe_1_all.deb."""
        pkg = self.root / "pkg"
        subprocess.run(["rm", "-rf", str(pkg)], check=True)
        (pkg / "DEBIAN").mkdir(parents=True)
        (pkg / "DEBIAN" / "control").write_text("Package: probe\nVersion: 1\nArchitecture: all\n"
                                                "Maintainer: t <t@t>\nDescription: t\n")
        (pkg / "usr" / "include").mkdir(parents=True)
        (pkg / "usr" / "include" / "probe.h").write_text(text)
        deb = self.root / ".deps" / "debs" / "probe_1_all.deb"
        subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(pkg), str(deb)], check=True,
                       capture_output=True)
        return deb

    def source_common(self):
        out = subprocess.run(["bash", "-c", 'OUTDIR="$1"; source "$2"', "-", str(self.root / "out"),
                              str(self.root / "scripts" / "gpu" / "common.sh")], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        return (self.root / ".deps" / "prefix" / "usr" / "include" / "probe.h").read_text()

    def test_unpacks_and_reunpacks_when_the_staged_debs_change(self):
        first = self.stage("one")
        self.assertEqual(self.source_common(), "one")
        marker = self.root / ".deps" / "prefix" / "kept"
        marker.write_text("")
        then = first.stat().st_mtime - 3600
        os.utime(first, (then, then))
        self.assertEqual(self.source_common(), "one")
        self.assertTrue(marker.exists(), "the prefix was unpacked again though nothing staged changed")
        deb = self.stage("two")
        os.utime(deb, (then, then))  # older than the stamp, as a copy without times may leave it
        self.assertEqual(self.source_common(), "two")
        self.assertFalse(marker.exists())


if __name__ == "__main__":
    unittest.main()
