#!/usr/bin/env python3
"""Writes torch 2.11's own compute-only CSV of one of its multi-stage schedules, for gpipe_runner's
--schedule-file (runner_cli_test.sh). Exit 77 when torch is not importable.

Usage: torch_schedule_to_csv.py {looped_bfs|interleaved_zb|zbv|dualpipev} RANKS MICROBATCHES OUT.csv
(two stages per rank; zbv and dualpipev with torch's V-shaped placement).
"""
import sys
import types

try:
    import torch
    import torch.distributed.pipelining.schedules as S
except ImportError as e:
    print(f"skip: torch is not importable ({e})")
    sys.exit(77)

CLASSES = {"looped_bfs": S.ScheduleLoopedBFS, "interleaved_zb": S.ScheduleInterleavedZeroBubble,
           "zbv": S.ScheduleZBVZeroBubble, "dualpipev": S.ScheduleDualPipeV}


def main() -> int:
    if len(sys.argv) != 5 or sys.argv[1] not in CLASSES:
        print(__doc__, file=sys.stderr)
        return 2
    name, p, m, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    n = 2 * p
    local = [0, n - 1] if name in ("zbv", "dualpipev") else [0, p]  # rank 0's stages
    # Stand-ins for rank 0's PipelineStage objects: all the schedule classes read.
    stages = [types.SimpleNamespace(num_stages=n, group_size=p, group_rank=0, stage_index=i, is_first=i == 0,
                                    is_last=i == n - 1, submod=torch.nn.Identity(), stage_index_to_group_rank=None)
              for i in local]
    CLASSES[name](stages, m, loss_fn=lambda out, target: out)._dump_csv(out, format="compute_only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
