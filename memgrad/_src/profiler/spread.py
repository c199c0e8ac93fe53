"""A call's peak over fresh processes: how far the executor's order moves it between processes.

Within a process a step's peak moves with the order in which the executor's threads run ready
ops, and between processes with more: the allocator's history and that order both start anew.
`measure_runs(..., processes=n)` measures the same step in ``n`` fresh processes and reports
the spread, so a figure can be quoted with its range instead of one process's reading.
"""

from __future__ import annotations

import dataclasses
import statistics

from memgrad._src.profiler.fresh import check_target, load_target, run_in_fresh_process
from memgrad._src.profiler.report import MemoryReport
from memgrad._src.units import format_bytes

_WORKER = "memgrad._src.profiler.spread:measure_here"


@dataclasses.dataclass(frozen=True)
class RunSpread:
    """The measured calls of one step in several fresh processes.

    Attributes:
      processes: one tuple of `MemoryReport` per process, its measured calls in order.
    """

    processes: tuple

    @property
    def process_peaks(self) -> list:
        """Each process's median ``peak_above_baseline_bytes`` over its calls."""
        return [int(statistics.median(r.peak_above_baseline_bytes for r in runs)) for runs in self.processes]

    @property
    def min_bytes(self) -> int:
        """The least of the processes' peaks (above each call's baseline)."""
        return min(self.process_peaks)

    @property
    def median_bytes(self) -> int:
        """The median of the processes' peaks: the figure to quote."""
        return int(statistics.median(self.process_peaks))

    @property
    def max_bytes(self) -> int:
        """The largest of the processes' peaks."""
        return max(self.process_peaks)

    @property
    def relative_spread(self) -> float:
        """``(max - min) / median`` of the processes' peaks."""
        return (self.max_bytes - self.min_bytes) / max(self.median_bytes, 1)

    def as_dict(self) -> dict:
        """The spread and every call's report, as plain dicts (JSON-serialisable)."""
        return {"min_bytes": self.min_bytes, "median_bytes": self.median_bytes, "max_bytes": self.max_bytes,
                "relative_spread": self.relative_spread, "process_peaks": self.process_peaks,
                "processes": [[r.as_dict() for r in runs] for runs in self.processes]}

    def __str__(self) -> str:
        return (f"RunSpread({len(self.processes)} processes: median {format_bytes(self.median_bytes)}, "
                f"range {format_bytes(self.min_bytes)} - {format_bytes(self.max_bytes)}, "
                f"spread {self.relative_spread:.0%})")


def measure_here(target, kwargs, device, warmup, repeats):
    """In a fresh process: builds the call with ``target(**kwargs)`` and measures it."""
    from memgrad._src.profiler.measure import measure_runs

    built = load_target(target)(**kwargs)
    if callable(built):
        fn, args = built, ()
    elif isinstance(built, (tuple, list)) and len(built) == 2 and callable(built[0]):
        fn, args = built
    else:
        raise TypeError(f"{target} must return the call to measure, or (call, args). "
                        f"Received: {type(built).__name__}")
    runs = measure_runs(fn, args, device=device, warmup=warmup, repeats=repeats)
    return [dataclasses.asdict(run) for run in runs]


def measure_in_fresh_processes(target, kwargs, *, processes, device, warmup, repeats, env=None,
                               timeout=600.0) -> RunSpread:
    """`measure_runs`' work for ``processes`` fresh processes, one after another."""
    check_target(target)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a positive integer. Received: processes={processes!r}")
    found = []
    for _ in range(processes):
        runs = run_in_fresh_process(_WORKER, [target, dict(kwargs or {}), device, warmup, repeats],
                                    env=env, timeout=timeout)
        found.append(tuple(MemoryReport(**run) for run in runs))
    return RunSpread(tuple(found))
