#!/usr/bin/env python3
"""Draws `orion-sim colocate --csv` output (issue 25): for each row, the pipeline's time over its time
alone (y) against the share of its idle GPU time the best-effort job used (x). Marker by GPU sharing
(time slicing without MPS, MPS), colour by how the job is managed; gpud rows labelled with their
in-flight budget. The goal region (pipeline <= 1.02x, bubble used >= 50%) is shaded.

Usage: plot_colocation.py COLOCATE.csv -o OUT.png [--title TEXT]
"""
import argparse
import csv
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("error: matplotlib is missing from this python (%s): run the script with .venv/bin/python "
             "(scripts/install-deps.sh installs it there) or pip install matplotlib" % sys.executable)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"unmanaged": "tab:red", "client priority": "tab:orange", "gpud": "tab:blue"}
MARKERS = {"time-slice": "s", "mps": "o"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--title", default="pipeline + best-effort job on one GPU (orion-sim colocate)")
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"plot_colocation.py: {args.csv} has no rows")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [100 * float(r["bubble_used"]) for r in rows]
    ys = [float(r["step_ratio"]) for r in rows]
    ax.fill_between([50, max(max(xs), 100) * 1.05], 0.98, 1.02, color="tab:green", alpha=0.12, label="goal")
    seen = set()
    for r, x, y in zip(rows, xs, ys):
        key = (r["sharing"], r["management"])
        label = f'{r["sharing"]}, {r["management"]}' if key not in seen else None
        seen.add(key)
        ax.scatter(x, y, c=COLORS.get(r["management"], "gray"), marker=MARKERS.get(r["sharing"], "x"), label=label)
        if r["management"] == "gpud":
            ax.annotate(f'{float(r["budget_us"]):.0f} us', (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("pipeline idle time used by the job (% of its idle time alone)")
    ax.set_ylabel("pipeline time / alone")
    ax.set_title(args.title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
