"""memgrad: train deeper and wider TensorFlow 2 models in less memory."""

from memgrad import layers

from memgrad.profiler import (
    BatchSearch,
    CappedRun,
    CappedRunError,
    MemoryReport,
    MemoryStatsUnavailableError,
    max_batch_size,
    measure,
    parse_bytes,
    run_capped,
)

__version__ = "0.1.0"

__all__ = [
    "layers",
    "BatchSearch",
    "CappedRun",
    "CappedRunError",
    "MemoryReport",
    "MemoryStatsUnavailableError",
    "max_batch_size",
    "measure",
    "parse_bytes",
    "run_capped",
]
