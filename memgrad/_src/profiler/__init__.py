"""memgrad's measuring instrument: peak memory of a call, what is alive at the peak, an emulated small device."""

from memgrad._src.profiler.emulated import BatchSearch, CappedRun, CappedRunError, max_batch_size, run_capped
from memgrad._src.profiler.predict import BatchPrediction, PeakPrediction, predict_max_batch_size, predict_peak
from memgrad._src.profiler.measure import (
    MemoryStatsUnavailableError,
    default_device,
    exact_cpu_stats_enabled,
    measure,
    measure_runs,
    memory_window,
    onednn_enabled,
    resolve_device,
)
from memgrad._src.profiler.live import (
    CATEGORIES,
    LiveTensor,
    MemoryCategories,
    PeakTensors,
    largest_live_tensors,
    memory_by_category,
)
from memgrad._src.profiler.kernel_check import KernelCheck, KernelResult, check_half_precision_kernels
from memgrad._src.profiler.oom import OutOfMemoryError, OutOfMemoryReport, explain_oom, oom_report
from memgrad._src.profiler.report import MemoryReport
from memgrad._src.profiler.spread import RunSpread
from memgrad._src.allocator import MemoryWindow
from memgrad._src.units import format_bytes, parse_bytes

__all__ = [
    "CATEGORIES",
    "BatchPrediction",
    "BatchSearch",
    "CappedRun",
    "CappedRunError",
    "KernelCheck",
    "KernelResult",
    "MemoryReport",
    "MemoryWindow",
    "MemoryStatsUnavailableError",
    "check_half_precision_kernels",
    "default_device",
    "exact_cpu_stats_enabled",
    "explain_oom",
    "format_bytes",
    "largest_live_tensors",
    "LiveTensor",
    "MemoryCategories",
    "OutOfMemoryError",
    "OutOfMemoryReport",
    "PeakPrediction",
    "PeakTensors",
    "RunSpread",
    "max_batch_size",
    "measure",
    "measure_runs",
    "memory_window",
    "onednn_enabled",
    "memory_by_category",
    "oom_report",
    "predict_max_batch_size",
    "predict_peak",
    "parse_bytes",
    "resolve_device",
    "run_capped",
]
