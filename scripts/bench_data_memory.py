#!/usr/bin/env python3
"""Host memory of loading a dataset: peak RSS of gpipe_runner per byte of input.

Writes a plain-text file and a CodeSearchNet folder (*.jsonl.gz) of two sizes each, runs
`gpipe_runner --steps 1 --stages 1` on each (configs/gpt_cpu_tiny.yaml, the byte tokenizer), and
reports the slope of peak RSS between the two sizes: the bytes held per input byte, free of the
model's and LibTorch's fixed cost. With the byte tokenizer the floor is 4 bytes per byte (one
int32 token per byte) plus the one document being tokenized.

  scripts/bench_data_memory.py [--runner build/trainer/gpipe_runner] [--sizes-mb 50 200]
"""
import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time


def words(rng):
    return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]


def write_text(path, size, rng, vocab):
    with open(path, "w") as f:
        n = 0
        while n < size:
            line = " ".join(rng.choice(vocab) for _ in range(12)) + "\n"
            f.write(line)
            n += len(line)
    return os.path.getsize(path)


def write_codesearchnet(folder, size, rng, vocab, files=4):
    """Records of about 1 KB (docstring + code), as CodeSearchNet's; returns the text bytes."""
    os.makedirs(folder)
    text = 0
    for i in range(files):
        with gzip.open(os.path.join(folder, f"python_train_{i}.jsonl.gz"), "wt", compresslevel=1) as f:
            while text < size * (i + 1) // files:
                doc = " ".join(rng.choice(vocab) for _ in range(20))
                code = "def f(a, b):\n" + "\n".join("    " + " ".join(rng.choice(vocab) for _ in range(10)) for _ in range(12))
                f.write(json.dumps({"docstring": doc, "code": code, "language": "python"}) + "\n")
                text += len(doc) + 1 + len(code)
    return text


def peak_rss(runner, root, kind, path, out):
    """Runs one step on `path`; returns the run's peak RSS in bytes (wait4's ru_maxrss, KiB)."""
    cmd = [runner, "--config", os.path.join(root, "configs/gpt_cpu_tiny.yaml"), "--set", f"dataset.name={kind}",
           "--set", f"dataset.path={path}", "--steps", "1", "--stages", "1", "--output-dir", out]
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit(f"[bench_data_memory] error: {' '.join(cmd)} failed:\n{stderr[-2000:]}")
    return usage.ru_maxrss * 1024


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", default=os.path.join(root, "build/trainer/gpipe_runner"))
    ap.add_argument("--sizes-mb", type=int, nargs=2, default=[50, 200])
    args = ap.parse_args()
    if not os.access(args.runner, os.X_OK):
        sys.exit(f"[bench_data_memory] error: no gpipe_runner at {args.runner}: build it (scripts/build.sh) or pass --runner")
    rng = random.Random(1)
    vocab = words(rng)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("text", "code_search_net"):
            points = []
            for mb in args.sizes_mb:
                path = os.path.join(tmp, f"{kind}_{mb}")
                size = (write_text(path + ".txt", mb * 10**6, rng, vocab) if kind == "text"
                        else write_codesearchnet(path, mb * 10**6, rng, vocab))
                start = time.monotonic()
                rss = peak_rss(args.runner, root, kind, path + ".txt" if kind == "text" else path, path + "_out")
                points.append((size, rss, time.monotonic() - start))
            (s0, r0, _), (s1, r1, t1) = points
            rows.append((kind, s0, r0, s1, r1, (r1 - r0) / (s1 - s0), t1))
    print("| dataset | input (MB) | peak RSS (MB) | input (MB) | peak RSS (MB) | RSS bytes per input byte |")
    print("|---|---|---|---|---|---|")
    for kind, s0, r0, s1, r1, slope, _ in rows:
        print(f"| {kind} | {s0 / 1e6:.0f} | {r0 / 1e6:.0f} | {s1 / 1e6:.0f} | {r1 / 1e6:.0f} | {slope:.2f} |")


if __name__ == "__main__":
    main()
