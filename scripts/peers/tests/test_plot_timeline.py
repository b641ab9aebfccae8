"""plot_timeline.py on hand-made traces: parsing of actions and micro-batches, the PNG, errors."""
import json
import struct
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts/

import plot_timeline  # noqa: E402


def one_f_one_b_trace(ranks: int = 4, microbatches: int = 4) -> dict:
    """A 1F1B timeline with unit forward and double backward, events named like gpipe_runner's."""
    events = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"stage {r}"}}
              for r in range(ranks)]
    for r in range(ranks):
        warmup = min(ranks - r - 1, microbatches)
        order = [("F", i) for i in range(warmup)]
        f, b = warmup, 0
        while b < microbatches:
            if f < microbatches:
                order.append(("F", f))
                f += 1
            order.append(("B", b))
            b += 1
        t = r * 1000.0
        for action, mb in order:
            dur = 1000.0 if action == "F" else 2000.0
            events.append({"ph": "X", "name": f"{action}{mb} s{r}", "pid": 0, "tid": r, "ts": t,
                           "dur": dur, "args": {"stage": r, "microbatch": mb, "action": action}})
            t += dur
    return {"traceEvents": events}


class PlotTimelineTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, doc) -> Path:
        path = self.dir / "timeline.json"
        path.write_text(json.dumps(doc))
        return path

    def test_reads_every_compute_event_with_action_and_microbatch(self):
        boxes, names = plot_timeline.read_boxes(self.write(one_f_one_b_trace(4, 4)))
        self.assertEqual(len(boxes), 4 * 4 * 2)
        self.assertEqual(names[(0, 2)], "stage 2")
        rank3 = sorted((b for b in boxes if b.track == (0, 3)), key=lambda b: b.start_us)
        self.assertEqual([(b.action, b.microbatch) for b in rank3[:3]], [("F", 0), ("B", 0), ("F", 1)])

    def test_tracks_sort_numerically(self):
        # 16 ranks: rank 10 comes after rank 9, not between rank 1 and rank 2.
        tracks = [(0, tid) for tid in (10, 2, 0, 11, 1, 9)]
        self.assertEqual([t[1] for t in sorted(tracks, key=plot_timeline.track_order)], [0, 1, 2, 9, 10, 11])
        self.assertEqual(sorted([(0, "lane"), (0, 3)], key=plot_timeline.track_order), [(0, 3), (0, "lane")])

    def test_sort_indices_come_from_the_trace(self):
        # gpipe_runner's overlap track of rank 0 (tid 8 of 4 ranks) sorts right after rank 0.
        trace = {"traceEvents": [
            {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": t, "args": {"sort_index": i}}
            for t, i in ((0, 0), (8, 1), (1, 128))]}
        path = self.dir / "sorted.json"
        path.write_text(json.dumps(trace))
        self.assertEqual(plot_timeline.read_sort_indices(path), {(0, 0): 0, (0, 8): 1, (0, 1): 128})

    def test_name_fallback_and_begin_end_pairs(self):
        doc = [{"ph": "B", "name": "W7 s0", "pid": 1, "tid": 0, "ts": 10},
               {"ph": "E", "pid": 1, "tid": 0, "ts": 35},
               {"ph": "X", "name": "I2 s1", "pid": 2, "tid": 0, "ts": 0, "dur": 5}]
        boxes, _ = plot_timeline.read_boxes(self.write(doc))
        self.assertEqual([(b.action, b.microbatch, b.dur_us) for b in boxes], [("W", 7, 25.0), ("I", 2, 5.0)])

    def test_writes_a_png_sized_for_the_ranks(self):
        path = self.write(one_f_one_b_trace(4, 8))
        out = self.dir / "t.png"
        self.assertEqual(plot_timeline.main([str(path), "-o", str(out)]), 0)
        header = out.read_bytes()[:24]
        self.assertEqual(header[:8], b"\x89PNG\r\n\x1a\n")
        width, height = struct.unpack(">II", header[16:24])
        self.assertGreater(width, height)  # a Gantt chart is wider than tall
        self.assertGreater(height, 200)

    def test_rejects_missing_empty_and_unbalanced_traces(self):
        with self.assertRaisesRegex(plot_timeline.TimelineError, "does not exist"):
            plot_timeline.read_boxes(self.dir / "nope.json")
        with self.assertRaisesRegex(plot_timeline.TimelineError, "no duration events"):
            plot_timeline.read_boxes(self.write({"traceEvents": []}))
        with self.assertRaisesRegex(plot_timeline.TimelineError, "without a begin"):
            plot_timeline.read_boxes(self.write([{"ph": "E", "pid": 0, "tid": 0, "ts": 1}]))
        (self.dir / "bad.json").write_text("{not json")
        self.assertEqual(plot_timeline.main([str(self.dir / "bad.json")]), 1)


if __name__ == "__main__":
    unittest.main()
