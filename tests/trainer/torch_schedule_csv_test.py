#!/usr/bin/env python3
"""Schedules between our CSV reader/writer (trainer/schedule/schedule_csv.h) and
torch.distributed.pipelining (2.11) itself, both ways.

Ours -> torch: for every generated kind and a range of shapes (also with overlapped pairs,
parallel.overlap_f_b=true, and dualpipev without them), the files schedule_csv_tool writes
  * with communication: torch's _PipelineScheduleRuntime._load_csv(format="compute_comms") takes
    them (its _validate_schedule: every stage's F/B/I/W counts, one rank per stage), parses every
    cell back to the same text, and its simulator _simulate_comms_compute runs them to the end;
  * compute-only: _load_csv(format="compute_only") takes them and lowers them (_add_send_recv),
    and the lowered schedule, less the UNSHARD/RESHARD/REDUCE_GRAD that torch's own simulator
    does not accept, simulates to the end; our lowering of the same file (schedule_csv_tool lower)
    is exactly torch's _add_send_recv on the file's actions.
Same order as torch: for looped_bfs, interleaved_zb, zbv, dualpipev and interleaved_1f1b, every
  shape torch 2.11's class accepts (p = 2..4, m = 1..16, v = 1..4 where the class takes it) gives
  our generator's compute order (schedule_csv_tool write ... compute_only, bubbles dropped) equal
  to the class's pipeline_order (None dropped, OVERLAP_F_B pairs kept), and every shape torch
  refuses is refused by ours.
Torch -> ours: files torch's schedule classes dump (Interleaved1F1B, LoopedBFS,
  InterleavedZeroBubble, ZBVZeroBubble with its V-shaped placement, DualPipeV with OVERLAP_F_B;
  GPipe and 1F1B through _get_pipeline_order), compute_only and compute_comms, are read and
  validated by ours, with the same programs (UNSHARD/RESHARD/REDUCE_GRAD dropped, OVERLAP_F_B
  kept as one overlapped pair) and torch's stage -> rank mapping; compute-only ones also lower to a valid schedule.

No process group is needed: the schedule classes only read a few attributes of their stages, so
plain objects stand in for them. Usage: torch_schedule_csv_test.py SCHEDULE_CSV_TOOL
Exit code 0: passed; 1: failed (each failure printed); 77: skipped (no torch), with the reason.
"""
import csv
import os
import subprocess
import sys
import tempfile
import types

SKIP = 77

try:
    import torch
    from torch.distributed.pipelining import schedules as S
except Exception as e:  # noqa: BLE001 - any import failure means: no usable torch here
    print(f"SKIP: torch.distributed.pipelining is not importable with {sys.executable}: {e}")
    sys.exit(SKIP)

TOOL = sys.argv[1] if len(sys.argv) > 1 else None
if not TOOL or not os.access(TOOL, os.X_OK):
    print(f"usage: {sys.argv[0]} SCHEDULE_CSV_TOOL (got {TOOL!r})")
    sys.exit(2)

failures = []
checks = 0


def fail(what, detail):
    failures.append(f"{what}: {detail}")
    print(f"FAIL {what}: {detail}")


def tool(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True)


def stage_objects(num_ranks, num_stages, stage_indices):
    """Stand-ins for rank 0's PipelineStage objects: what the schedule classes read."""
    return [
        types.SimpleNamespace(num_stages=num_stages, group_size=num_ranks, group_rank=0, stage_index=i,
                              is_first=i == 0, is_last=i == num_stages - 1, submod=torch.nn.Identity(),
                              stage_index_to_group_rank=None)
        for i in stage_indices
    ]


def runtime(num_ranks, num_stages, microbatches, placement):
    local = [s for s in range(num_stages) if placement[s] == 0]
    return S._PipelineScheduleRuntime(stage_objects(num_ranks, num_stages, local), microbatches,
                                      loss_fn=lambda out, target: out)


DROPPED = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}


def leaves(actions):
    """Actions as our IR keeps them: None gone, UNSHARD/RESHARD/REDUCE_GRAD dropped, an OVERLAP_F_B
    one pair written as torch writes it, "(0F3;3B1)OVERLAP_F_B"."""
    return [str(a) for a in actions
            if a is not None and (a.sub_actions is not None or a.computation_type.value not in DROPPED)]


def expand_overlaps(order):
    """OVERLAP_F_B actions as their sub-actions in order, for torch 2.11's _simulate_comms_compute,
    which does not know them (it looks up the placeholder stage -1 of the container and raises
    KeyError, on torch's own DualPipeV too); its runtime runs them in this order when no overlap
    callback is registered."""
    out = {}
    for rank, actions in order.items():
        out[rank] = []
        for a in actions:
            out[rank].extend(a.sub_actions if a is not None and a.sub_actions is not None else [a])
    return out


def read_with_ours(path, what):
    """(placement, per-rank action lists) as schedule_csv_tool read prints them, or None."""
    r = tool("read", path)
    if r.returncode != 0:
        fail(what, f"our reader refused it:\n{r.stderr}")
        return None
    lines = r.stdout.splitlines()
    placement = [int(x) for x in lines[1].split()[1:]]
    return placement, [line.split() for line in lines[2:]]


def write_csv(path, order):
    with open(path, "w", newline="") as f:  # as torch's _dump_csv does
        writer = csv.writer(f)
        for rank in sorted(order):
            writer.writerow(order[rank])


# --- ours -> torch ----------------------------------------------------------------------------

def shapes():
    """(kind, ranks, micro-batches, stages per rank, parallel.overlap_f_b)."""
    for kind in ("gpipe", "1f1b", "zb_h1"):
        for p in (1, 2, 3, 4):
            for m in (1, 2, 3, 4, 6, 8):
                yield kind, p, m, 1, "auto"
    for p in (2, 3, 4):
        for v in (2, 3):
            for m in (p, 2 * p, 3 * p):
                yield "interleaved_1f1b", p, m, v, "auto"
    # The kinds ported from torch's multi-stage classes, and interleaved 1F1B's flex rounds.
    for p in (2, 3, 4):
        yield "interleaved_1f1b", p, p + 1, 2, "auto"
        for m in (p + 1, 2 * p):
            yield "looped_bfs", p, m, 2, "auto"
            yield "interleaved_zb", p, m, 2, "auto"
            yield "zbv", p, m, 2, "auto"
        yield "dualpipev", p, 2 * p, 2, "auto"
        yield "dualpipev", p, 3 * p, 2, "auto"
    # Overlapped pairs (OVERLAP_F_B cells) added to the others, and taken out of dualpipev.
    for p in (2, 3, 4):
        for m in (p, 2 * p):
            for kind in ("1f1b", "zb_h1"):
                yield kind, p, m, 1, "true"
            for kind in ("interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv"):
                yield kind, p, m, 2, "true"
        yield "dualpipev", p, 2 * p, 2, "false"


V_KINDS = ("zbv", "dualpipev")


def generated_placement(kind, p, v):
    """Stage -> rank of our generators: round robin, or the V of zbv and dualpipev."""
    if kind in V_KINDS:
        return [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    return [s % p for s in range(p * v)]


def ours_to_torch(tmp):
    global checks
    for kind, p, m, v, overlap in shapes():
        what = f"ours {kind} p={p} m={m} v={v} overlap_f_b={overlap}"
        n = p * v
        placement = generated_placement(kind, p, v)

        # With communication.
        r = tool("write", kind, str(p), str(m), str(v), "compute_comms", overlap)
        if r.returncode != 0:
            fail(what, f"schedule_csv_tool write failed: {r.stderr}")
            continue
        path = os.path.join(tmp, "ours_comms.csv")
        with open(path, "w") as f:
            f.write(r.stdout)
        try:
            sched = runtime(p, n, m, placement)
            sched._load_csv(path, format="compute_comms")
            rows = [row for row in csv.reader(open(path, newline=""))]
            for rank, row in enumerate(rows):
                parsed = [str(a) for a in sched.pipeline_order_with_comms[rank]]
                if parsed != row:
                    fail(what, f"torch parses rank {rank}'s row differently:\n  file  {row}\n  torch {parsed}")
            if sched.stage_index_to_group_rank != dict(enumerate(placement)):
                fail(what, f"torch infers placement {sched.stage_index_to_group_rank}, we wrote {placement}")
            S._simulate_comms_compute(expand_overlaps(sched.pipeline_order_with_comms),
                                      lambda s: sched.stage_index_to_group_rank[s], n)
        except Exception as e:  # noqa: BLE001
            fail(what + " compute_comms", f"torch refused our file: {type(e).__name__}: {e}\n{r.stdout}")
        checks += 1

        # Compute-only.
        r = tool("write", kind, str(p), str(m), str(v), "compute_only", overlap)
        path = os.path.join(tmp, "ours_compute.csv")
        with open(path, "w") as f:
            f.write(r.stdout)
        try:
            sched = runtime(p, n, m, placement)
            sched._load_csv(path, format="compute_only")  # validates and lowers (_add_send_recv)
            lowered = {rank: [a for a in acts if a.computation_type.value not in DROPPED]
                       for rank, acts in sched.pipeline_order_with_comms.items()}
            # torch's _simulate() would raise on its own UNSHARD: simulate without them.
            S._simulate_comms_compute(expand_overlaps(lowered), lambda s: sched.stage_index_to_group_rank[s], n)
            # Our lowering of a compute-only file is torch's _add_send_recv on its actions.
            compute = {rank: [a for a in acts if a is not None] for rank, acts in sched.pipeline_order.items()}
            expected = S._add_send_recv(compute, stage_to_rank=lambda s: placement[s], num_stages=n)
            ours = tool("lower", path)
            if ours.returncode != 0:
                fail(what + " compute_only", f"our lowering failed:\n{ours.stderr}")
            else:
                got = [line.split(",") for line in ours.stdout.splitlines()]
                for rank in range(p):
                    want = [str(a) for a in expected[rank]]
                    if got[rank] != want:
                        fail(what + " compute_only", f"rank {rank}: our lowering differs from torch's _add_send_recv:"
                                                     f"\n  ours  {got[rank]}\n  torch {want}")
        except Exception as e:  # noqa: BLE001
            fail(what + " compute_only", f"torch refused our file: {type(e).__name__}: {e}\n{r.stdout}")
        checks += 1


# --- our generators' orders == torch's classes' orders ---------------------------------------

TORCH_CLASS = {
    "interleaved_1f1b": S.ScheduleInterleaved1F1B,
    "looped_bfs": S.ScheduleLoopedBFS,
    "interleaved_zb": S.ScheduleInterleavedZeroBubble,
    "zbv": S.ScheduleZBVZeroBubble,
    "dualpipev": S.ScheduleDualPipeV,
}


def same_order_as_torch():
    """Returns how many shapes torch accepts that were compared."""
    global checks
    compared = 0
    for kind, cls in TORCH_CLASS.items():
        for p in (2, 3, 4):
            for v in ((2,) if kind in V_KINDS else (1, 2, 3, 4)):
                n = p * v
                placement = generated_placement(kind, p, v)
                local = [s for s in range(n) if placement[s] == 0]  # rank 0's stages, as torch builds them
                for m in range(1, 17):
                    what = f"order {kind} p={p} m={m} v={v}"
                    try:
                        sched = cls(stage_objects(p, n, local), m, loss_fn=lambda out, target: out)
                    except ValueError as e:
                        checks += 1
                        r = tool("write", kind, str(p), str(m), str(v), "compute_only")
                        if r.returncode == 0:
                            fail(what, f"torch refuses the shape ({e}) but ours generates it")
                        continue
                    checks += 1
                    compared += 1
                    r = tool("write", kind, str(p), str(m), str(v), "compute_only")
                    if r.returncode != 0:
                        fail(what, f"torch accepts the shape but ours refuses it: {r.stderr}")
                        continue
                    ours = [[cell for cell in row.split(",") if cell] for row in r.stdout.splitlines()]
                    if sched.stage_index_to_group_rank != dict(enumerate(placement)):
                        fail(what, f"torch's placement {sched.stage_index_to_group_rank}, ours {placement}")
                    for rank in range(p):
                        want = leaves(sched.pipeline_order[rank])
                        have = ours[rank] if rank < len(ours) else []
                        if have != want:
                            fail(what, f"rank {rank}:\n  ours  {have}\n  torch {want}")
    return compared


# --- torch -> ours ----------------------------------------------------------------------------

def torch_schedules():
    """(name, schedule object, num_ranks, num_stages, placement) for torch's own schedule classes."""
    loss = lambda out, target: out  # noqa: E731
    for p in (2, 3, 4):
        for m in (p, 2 * p):
            for cls in (S.ScheduleInterleaved1F1B, S.ScheduleLoopedBFS, S.ScheduleInterleavedZeroBubble):
                n = 2 * p
                yield (f"{cls.__name__} p={p} m={m}", cls(stage_objects(p, n, [0, p]), m, loss_fn=loss), p, n)
            for cls in (S.ScheduleZBVZeroBubble, S.ScheduleDualPipeV):
                n = 2 * p
                if cls is S.ScheduleDualPipeV and m < 2 * p:
                    continue  # DualPipeV wants at least 2 x ranks micro-batches
                yield (f"{cls.__name__} p={p} m={m}", cls(stage_objects(p, n, [0, n - 1]), m, loss_fn=loss), p, n)


def torch_validates(order, p, n, m):
    try:
        S._validate_schedule(order, p, n, m)
        return True
    except AssertionError:
        return False


def check_torch_file(path, what, expected_rows, placement, lower):
    global checks
    got = read_with_ours(path, what)
    checks += 1
    if got is None:
        return
    our_placement, programs = got
    if our_placement != placement:
        fail(what, f"placement: ours {our_placement}, torch {placement}")
    for rank, want in enumerate(expected_rows):
        have = programs[rank] if rank < len(programs) else []
        if have != want:
            fail(what, f"rank {rank}:\n  ours  {have}\n  torch {want}")
    if lower:
        r = tool("lower", path)
        if r.returncode != 0:
            fail(what + " (lowered)", f"our lowering of torch's compute-only file does not validate:\n{r.stderr}")


def torch_to_ours(tmp):
    global checks
    for name, sched, p, n in torch_schedules():
        placement = [sched.stage_index_to_group_rank[s] for s in range(n)]
        path = os.path.join(tmp, "torch.csv")
        sched._dump_csv(path, format="compute_only")
        check_torch_file(path, f"torch {name} compute_only",
                         [leaves(sched.pipeline_order[r]) for r in range(p)], placement, lower=True)
        sched._dump_csv(path, format="compute_comms")
        check_torch_file(path, f"torch {name} compute_comms",
                         [leaves(sched.pipeline_order_with_comms[r]) for r in range(p)], placement, lower=False)
    # Single-stage schedules have no _dump_csv; their pipeline order written as _dump_csv writes one.
    for cls in (S.ScheduleGPipe, S.Schedule1F1B):
        for p in (2, 3, 4):
            for m in (1, 3, 4, 8):
                if cls is S.Schedule1F1B and m < p:
                    continue  # torch's 1F1B wants at least as many micro-batches as stages
                stage = stage_objects(p, p, [0])[0]
                sched = cls(stage, m, loss_fn=lambda out, target: out)
                order = sched._get_pipeline_order()
                path = os.path.join(tmp, "torch_single.csv")
                write_csv(path, order)
                what = f"torch {cls.__name__} p={p} m={m} compute_only"
                if torch_validates(order, p, p, m):
                    check_torch_file(path, what, [leaves(order[r]) for r in range(p)], list(range(p)), lower=True)
                else:
                    # torch 2.11's Schedule1F1B._get_pipeline_order starts the last rank's forwards
                    # at micro-batch 1 (its runtime does not use this order); torch's own
                    # _validate_schedule refuses it, and so must ours.
                    checks += 1
                    r = tool("read", path)
                    if r.returncode == 0:
                        fail(what, "ours accepts a schedule torch's _validate_schedule refuses:\n"
                                   + open(path).read())
                    else:
                        print(f"note: {what}: torch's own order is invalid; torch and ours both refuse it")


def main():
    print(f"torch {torch.__version__}, tool {TOOL}")
    with tempfile.TemporaryDirectory(prefix="ourgpipe_torch_csv_") as tmp:
        ours_to_torch(tmp)
        compared = same_order_as_torch()
        print(f"our generators' orders compared with torch's on {compared} shapes torch accepts")
        torch_to_ours(tmp)
    if failures:
        print(f"{len(failures)} of {checks} checks failed")
        return 1
    print(f"ok: {checks} checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
