"""What libgpu_scheduler.so saw, read from inside the process it is preloaded into (ctypes).

Launch counts come from the shim's trace (ORION_TRACE): orion_flush() (intercept/include/orion.h)
submits what is queued and rewrites the trace file, which has one Chrome-trace "X" event per op
with args.kind ("kernel", "graph_launch", "copy", ...). Counting kinds before and after a region
gives the kernels and graph launches the shim scheduled in it. orion_get_stats adds the totals.
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
from pathlib import Path

SHIM_NAME = "libgpu_scheduler.so"


class ShimCounterError(RuntimeError):
    pass


class OrionStats(ctypes.Structure):
    # Mirrors `orion_stats` in intercept/include/orion.h (the size is passed, so appending
    # fields there stays compatible with this copy).
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "intercepted", "submitted", "submitted_inline", "deferred", "forced_by_starvation",
        "caller_waits", "queued_now", "backend_errors", "tracked_in_flight", "communication_streams",
        "promoted", "thread_classed", "partition_moved", "partition_in_place", "release_calls",
        "release_calls_released",
        # 1 once the shim holds nothing back for good (an entry point it could not wrap was handed
        # out; its log names it): a phase's delta shows it, scheduled-mode figures then mean little.
        "holding_stopped")]


def shim_is_loaded() -> bool:
    return SHIM_NAME in Path("/proc/self/maps").read_text()


def shim_stats() -> dict[str, int] | None:
    """orion_get_stats of the shim preloaded here (no trace needed), or None without one."""
    if not shim_is_loaded():
        return None
    lib = ctypes.CDLL(None)
    try:
        get = lib.orion_get_stats
    except AttributeError as e:
        raise ShimCounterError(f"{SHIM_NAME} is loaded but does not export orion_get_stats ({e})") from None
    get.argtypes = [ctypes.POINTER(OrionStats), ctypes.c_size_t]
    stats = OrionStats()
    if get(ctypes.byref(stats), ctypes.sizeof(stats)) != 0:
        return {}  # pass-through mode: the shim keeps no stats
    return {n: getattr(stats, n) for n, _ in OrionStats._fields_}


class ShimCounters:
    def __init__(self) -> None:
        self.trace = os.environ.get("ORION_TRACE")
        if not self.trace:
            raise ShimCounterError("the shim is loaded but ORION_TRACE is not set: the launch counts "
                                   "are read from its trace (set ORION_TRACE=/path/trace.json)")
        lib = ctypes.CDLL(None)  # the global namespace, where the LD_PRELOADed shim's symbols are
        try:
            self._flush, self._stats, active = lib.orion_flush, lib.orion_get_stats, lib.orion_is_active
        except AttributeError as e:
            raise ShimCounterError(f"{SHIM_NAME} is loaded but does not export the orion.h API ({e})") from None
        self._stats.argtypes = [ctypes.POINTER(OrionStats), ctypes.c_size_t]
        if active() != 1:
            raise ShimCounterError("the shim is loaded in pass-through mode: set USE_ORION_SCHEDULER=1")

    @classmethod
    def if_loaded(cls) -> "ShimCounters | None":
        return cls() if shim_is_loaded() else None

    def read(self) -> dict[str, int]:
        """Ops per kind submitted so far, plus the orion_get_stats totals (as 'stats.<field>')."""
        rc = self._flush()
        if rc != 0:
            raise ShimCounterError(f"orion_flush returned {rc} (a deferred op failed in the driver)")
        try:
            events = json.loads(Path(self.trace).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ShimCounterError(f"cannot read the shim's trace {self.trace}: {e}") from None
        events = events.get("traceEvents", []) if isinstance(events, dict) else events
        kinds = collections.Counter(e["args"]["kind"] for e in events
                                    if e.get("ph") == "X" and "kind" in (e.get("args") or {}))
        stats = OrionStats()
        rc = self._stats(ctypes.byref(stats), ctypes.sizeof(stats))
        if rc != 0:
            raise ShimCounterError(f"orion_get_stats returned {rc}")
        counts = dict(kinds)
        counts.update({f"stats.{n}": getattr(stats, n) for n, _ in OrionStats._fields_})
        return counts


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
