#!/usr/bin/env python3
"""Draws a pipeline timeline (gpipe_runner's timeline.json, a Chrome trace) as a PNG Gantt chart.

One row per rank (trace track), one box per compute event, coloured by action
(F forward, B backward, I input-grad, W weight-grad; other events grey) with the micro-batch
number inside. Reads complete events (ph "X") and begin/end pairs (ph "B"/"E"); the action and
micro-batch come from args {action, microbatch} or, failing that, from names like "F3 s1".

    python scripts/plot_timeline.py runs/latest/timeline.json -o timeline.png
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#55A868"}
OTHER_COLOUR = "#B0B0B0"
NAME_PATTERN = re.compile(r"^(?P<action>[A-Z]+)(?P<mb>\d+)")


class TimelineError(ValueError):
    pass


@dataclass
class Box:
    track: tuple
    start_us: float
    dur_us: float
    action: str
    microbatch: int | None
    label: str


def _action_of(event: dict) -> tuple[str, int | None]:
    args = event.get("args") or {}
    action, mb = args.get("action"), args.get("microbatch")
    m = NAME_PATTERN.match(str(event.get("name", "")))
    if action is None and m:
        action = m.group("action")
    if mb is None and m:
        mb = int(m.group("mb"))
    action = str(action or event.get("name", "?"))
    # Long forms ("forward", "backward_input") map onto the one-letter ones.
    long_forms = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
    return long_forms.get(action.lower(), action), (int(mb) if mb is not None else None)


def _trace_events(path: Path) -> list:
    """The events of a Chrome trace file (a list, or an object with 'traceEvents')."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise TimelineError(f"timeline '{path}' does not exist (gpipe_runner writes it to "
                            "OUTPUT_DIR/timeline.json)") from None
    except json.JSONDecodeError as e:
        raise TimelineError(f"timeline '{path}' is not JSON: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TimelineError(f"timeline '{path}': expected a Chrome trace (a list of events or "
                            "an object with 'traceEvents')")
    return events


def read_boxes(path: Path) -> tuple[list[Box], dict[tuple, str]]:
    """Boxes and track names ((pid, tid) -> name) from a Chrome trace file."""
    events = _trace_events(path)
    names: dict[tuple, str] = {}
    boxes: list[Box] = []
    open_events: dict[tuple, list[dict]] = {}
    for ev in events:
        track = (ev.get("pid", 0), ev.get("tid", 0))
        ph = ev.get("ph")
        if ph == "M" and ev.get("name") in ("thread_name", "process_name"):
            # A thread name is the more specific label; keep it over the process name.
            if ev["name"] == "thread_name" or track not in names:
                names[track] = str((ev.get("args") or {}).get("name", ""))
        elif ph == "X":
            action, mb = _action_of(ev)
            boxes.append(Box(track, float(ev["ts"]), float(ev.get("dur", 0)), action, mb, ev.get("name", "")))
        elif ph == "B":
            open_events.setdefault(track, []).append(ev)
        elif ph == "E":
            if not open_events.get(track):
                raise TimelineError(f"timeline '{path}': end event at ts={ev.get('ts')} on track "
                                    f"{track} without a begin event")
            begin = open_events[track].pop()
            action, mb = _action_of(begin)
            boxes.append(Box(track, float(begin["ts"]), float(ev["ts"]) - float(begin["ts"]), action,
                             mb, begin.get("name", "")))
    if not boxes:
        raise TimelineError(f"timeline '{path}' has no duration events (ph 'X' or 'B'/'E') to draw")
    return boxes, names


def read_sort_indices(path: Path) -> dict[tuple, int]:
    """The traces' thread_sort_index metadata ((pid, tid) -> index): gpipe_runner sorts a rank's
    forward lane and its overlap tracks right after the rank, whatever their tids."""
    order = {}
    for ev in _trace_events(path):
        if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "thread_sort_index":
            index = (ev.get("args") or {}).get("sort_index")
            if isinstance(index, int):
                order[(ev.get("pid", 0), ev.get("tid", 0))] = index
    return order


def _default_track_name(track: tuple, tracks: list[tuple]) -> str:
    # A trace puts ranks in tids of one process, or in processes: name by whichever varies.
    if len({t[0] for t in tracks}) == 1:
        return f"rank {track[1]}"
    if len({t[1] for t in tracks}) == 1:
        return f"rank {track[0]}"
    return f"pid {track[0]} tid {track[1]}"


def track_order(track: tuple) -> tuple:
    """Sort key of a (pid, tid) track: numbers numerically (rank 10 after rank 9, not after rank 1),
    names after them."""
    def part(x):
        text = str(x)
        return (0, int(text), "") if text.lstrip("-").isdigit() else (1, 0, text)
    return tuple(part(x) for x in track)


def plot(boxes: list[Box], names: dict[tuple, str], output: Path, title: str,
         sort_index: dict[tuple, int] | None = None) -> None:
    try:
        import matplotlib
    except ImportError:
        sys.exit("error: matplotlib is missing from this python (%s): run the script with .venv/bin/python "
                 "(scripts/install-deps.sh installs it there) or pip install matplotlib" % sys.executable)
    matplotlib.use("Agg")  # files only; no display on the build machines
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    # The trace's own order first (thread_sort_index), then numbers numerically.
    order = sort_index or {}
    tracks = sorted({b.track for b in boxes}, key=lambda t: (order.get(t, float("inf")), track_order(t)))
    row = {t: i for i, t in enumerate(tracks)}
    t0 = min(b.start_us for b in boxes)
    span_ms = (max(b.start_us + b.dur_us for b in boxes) - t0) / 1e3
    fig, ax = plt.subplots(figsize=(max(8.0, min(40.0, 0.25 * len(boxes) / len(tracks) + 6)),
                                    1.0 + 0.6 * len(tracks)))
    # Compute boxes are drawn last and full height, so send/receive/wait spans (thin, grey)
    # that overlap them never hide them.
    for b in sorted(boxes, key=lambda b: b.action in COLOURS):
        x, w = (b.start_us - t0) / 1e3, b.dur_us / 1e3
        half = 0.4 if b.action in COLOURS else 0.15
        ax.broken_barh([(x, w)], (row[b.track] - half, 2 * half),
                       facecolors=COLOURS.get(b.action, OTHER_COLOUR), edgecolor="black", linewidth=0.4)
        if b.action in COLOURS and b.microbatch is not None and w > span_ms / 400:
            ax.text(x + w / 2, row[b.track], str(b.microbatch), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([names.get(t) or _default_track_name(t, tracks) for t in tracks])
    ax.invert_yaxis()  # rank 0 on top, as in the schedule grids
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    used = [a for a in COLOURS if any(b.action == a for b in boxes)]
    handles = [Patch(color=COLOURS[a], label=a) for a in used]
    others = sorted({b.action for b in boxes} - set(COLOURS))
    if others:
        handles.append(Patch(color=OTHER_COLOUR, label="/".join(others)))
    ax.legend(handles=handles,
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("timeline", type=Path, help="Chrome-trace JSON (gpipe_runner's timeline.json)")
    p.add_argument("-o", "--output", type=Path, help="PNG to write (default: TIMELINE with .png)")
    p.add_argument("--title", help="chart title (default: the file name)")
    args = p.parse_args(argv)
    try:
        boxes, names = read_boxes(args.timeline)
    except TimelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    output = args.output or args.timeline.with_suffix(".png")
    plot(boxes, names, output, args.title or str(args.timeline), read_sort_indices(args.timeline))
    print(f"wrote {output} ({len(boxes)} events on {len({b.track for b in boxes})} tracks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
