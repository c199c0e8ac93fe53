"""memgrad: train deeper and wider TensorFlow 2 models in less memory."""

from memgrad import layers, selective

from memgrad.checkpointing import (
    Analysis,
    Budget,
    BudgetError,
    GradientTape,
    analyze,
    checkpoint,
    disable_checkpointing,
    enable_checkpointing,
    gradients,
    monkey_patch,
    unpatch,
)

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

from memgrad.selective import convert

__version__ = "0.1.0"

__all__ = [
    "layers",
    "Analysis",
    "Budget",
    "BudgetError",
    "GradientTape",
    "analyze",
    "checkpoint",
    "disable_checkpointing",
    "enable_checkpointing",
    "gradients",
    "monkey_patch",
    "unpatch",
    "selective",
    "convert",
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
