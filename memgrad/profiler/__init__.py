"""memgrad's measuring instrument: the peak memory of a call, what is alive at the peak, an
emulated small device for "what is the largest batch that fits", and a prediction of a traced
step's peak without running it (`predict_peak`, `predict_max_batch_size`).

Example:
  ```python
  import tensorflow as tf
  import memgrad

  report = memgrad.profiler.measure(lambda x: tf.reduce_sum(tf.tanh(x)), args=(tf.ones([256, 256]),))
  print(report.peak_bytes)
  ```

`memgrad.profiler.workloads` holds small reference training steps to try it on.
`CATEGORIES` names what a step's peak holds, in the order `memory_by_category` reports it:
weights, optimizer state, inputs and other, activations, gradients, temporaries.
"""

from memgrad._src.profiler import (
    CATEGORIES,
    BatchPrediction,
    BatchSearch,
    CappedRun,
    CappedRunError,
    KernelCheck,
    KernelResult,
    LiveTensor,
    MemoryCategories,
    MemoryReport,
    MemoryWindow,
    MemoryStatsUnavailableError,
    OutOfMemoryError,
    OutOfMemoryReport,
    PeakPrediction,
    PeakTensors,
    RunSpread,
    check_half_precision_kernels,
    default_device,
    exact_cpu_stats_enabled,
    explain_oom,
    largest_live_tensors,
    max_batch_size,
    measure,
    measure_runs,
    memory_window,
    memory_by_category,
    onednn_enabled,
    oom_report,
    predict_max_batch_size,
    predict_peak,
    resolve_device,
    run_capped,
)
from memgrad._src.units import format_bytes, parse_bytes

__all__ = [
    "CATEGORIES",
    "BatchPrediction",
    "BatchSearch",
    "CappedRun",
    "CappedRunError",
    "KernelCheck",
    "KernelResult",
    "LiveTensor",
    "MemoryCategories",
    "MemoryReport",
    "MemoryWindow",
    "MemoryStatsUnavailableError",
    "OutOfMemoryError",
    "OutOfMemoryReport",
    "PeakPrediction",
    "PeakTensors",
    "RunSpread",
    "check_half_precision_kernels",
    "default_device",
    "exact_cpu_stats_enabled",
    "explain_oom",
    "format_bytes",
    "largest_live_tensors",
    "max_batch_size",
    "measure",
    "measure_runs",
    "memory_window",
    "memory_by_category",
    "onednn_enabled",
    "oom_report",
    "predict_max_batch_size",
    "predict_peak",
    "parse_bytes",
    "resolve_device",
    "run_capped",
]
