#!/usr/bin/env python3
"""Draws `orion-sim sweep --csv` output: high-priority p99 latency against best-effort throughput
(each over its client alone), one marker per grid point coloured by policy (the adaptive partition,
policy column "partition-adaptive", as stars), the Pareto front as a
line, and the goal region (HP p99 <= 1.10x, BE >= 0.60x) shaded.

Usage: plot_sweep.py SWEEP.csv [SWEEP2.csv ...] -o OUT.png [--title TEXT]
With several files, one panel each (titled by the file name unless --title is given).
"""
import argparse
import csv
import os
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("error: matplotlib is missing from this python (%s): run the script with .venv/bin/python "
             "(scripts/install-deps.sh installs it there) or pip install matplotlib" % sys.executable)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"priority": "tab:red", "orion": "tab:orange", "partition": "tab:blue", "partition-adaptive": "tab:green"}
MARKERS = {"partition-adaptive": "*"}


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"plot_sweep.py: {path} has no points")
    for r in rows:
        r["hp"] = float(r["hp_p99_ratio"])
        r["be"] = float(r["be_ratio"])
        r["front"] = r["pareto"] == "1"
    return rows


def panel(ax, rows, title):
    ax.fill_between([0.60, 1.05], 0.95, 1.10, color="tab:green", alpha=0.12, label="goal")
    for policy, color in COLORS.items():
        pts = [r for r in rows if r["policy"] == policy]
        if pts:
            big = policy in MARKERS
            ax.scatter([r["be"] for r in pts], [r["hp"] for r in pts], s=70 if big else 18, color=color,
                       marker=MARKERS.get(policy, "o"), edgecolors="black" if big else "none", linewidths=0.5,
                       label=policy, zorder=3 if big else 2)
    front = sorted((r for r in rows if r["front"]), key=lambda r: r["be"])
    ax.plot([r["be"] for r in front], [r["hp"] for r in front], color="black", linewidth=1, label="Pareto front")
    ax.set_xlabel("best-effort throughput / alone")
    ax.set_ylabel("high-priority p99 latency / alone")
    ax.set_title(title)
    ax.set_xlim(0, 1.05)
    ax.set_ylim(0.95, max(2.5, max(r["hp"] for r in rows) * 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--title")
    args = p.parse_args()
    fig, axes = plt.subplots(1, len(args.csv), figsize=(5.5 * len(args.csv), 4.5), squeeze=False)
    for ax, path in zip(axes[0], args.csv):
        panel(ax, read(path), args.title or os.path.basename(path))
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot_sweep.py: wrote {args.output}")


if __name__ == "__main__":
    main()
