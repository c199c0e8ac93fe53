"""memgrad's measuring instrument: peak memory of a call, what is alive at the peak, an emulated small device."""

from memgrad.profiler.emulated import BatchSearch, CappedRun, CappedRunError, max_batch_size, run_capped
from memgrad.profiler.measure import (
    MemoryStatsUnavailableError,
    default_device,
    exact_cpu_stats_enabled,
    measure,
    resolve_device,
)
from memgrad.profiler.live import LiveTensor, PeakTensors, largest_live_tensors
from memgrad.profiler.report import MemoryReport, format_bytes, parse_bytes

__all__ = [
    "BatchSearch",
    "CappedRun",
    "CappedRunError",
    "MemoryReport",
    "MemoryStatsUnavailableError",
    "default_device",
    "exact_cpu_stats_enabled",
    "format_bytes",
    "largest_live_tensors",
    "LiveTensor",
    "PeakTensors",
    "max_batch_size",
    "measure",
    "parse_bytes",
    "resolve_device",
    "run_capped",
]
