"""memgrad: train deeper and wider TensorFlow 2 models in less memory.

The API is this module and four namespaces; everything under ``memgrad._src`` is private.

- ``memgrad``: automatic gradient checkpointing (`gradients`, `GradientTape`, `monkey_patch`,
  `enable_checkpointing`, `analyze`), the `recompute` primitive and its diagnostics.
- `memgrad.strategies`: the checkpoint policies (`Memory`, `Speed`, `Collection`, `Tensors`,
  `Budget`).
- `memgrad.layers`: Keras layers: reversible blocks, `Checkpoint`.
- `memgrad.selective`: selective-differentiation layers and `convert`.
- `memgrad.profiler`: `measure`, `max_batch_size` and the rest of the measuring instrument.

The ``memgrad-profile`` command lives in `memgrad.cli`; the model zoo installs as
``memgrad_zoo`` (``pip install 'memgrad[zoo]'``).
"""

from memgrad._src.tf_internals import check_versions as _check_versions
from memgrad._src.tf_internals import request_cpu_allocator_statistics as _request_cpu_allocator_statistics

_check_versions()
# The profiler reads allocator statistics; on CPU they need TensorFlow's BFC allocator, chosen
# when TensorFlow runs its first op. Importing memgrad before that (before or after importing
# TensorFlow) is enough; TF_CPU_ALLOCATOR_USE_BFC set by the user, to either value, is kept.
_request_cpu_allocator_statistics()

from memgrad import layers, profiler, selective, strategies  # noqa: E402
from memgrad._src.checkpointing import (  # noqa: E402
    Analysis,
    BudgetError,
    GradientTape,
    LoopRecord,
    RewriteRecord,
    analyze,
    disable_checkpointing,
    enable_checkpointing,
    gradients,
    mark_checkpoint,
    monkey_patch,
    record_rewrites,
    unpatch,
)
from memgrad._src.recompute import recompute  # noqa: E402

__version__ = "0.2.0"

__all__ = [
    "Analysis",
    "BudgetError",
    "GradientTape",
    "LoopRecord",
    "RewriteRecord",
    "analyze",
    "disable_checkpointing",
    "enable_checkpointing",
    "gradients",
    "layers",
    "mark_checkpoint",
    "monkey_patch",
    "profiler",
    "recompute",
    "record_rewrites",
    "selective",
    "strategies",
    "unpatch",
]

# Old names, kept for one release: each access warns and names the new one.
_DEPRECATED = {"Rewrite": "RewriteRecord", "checkpoint": "mark_checkpoint"}


def __getattr__(name):
    if name in _DEPRECATED:
        import warnings

        new = _DEPRECATED[name]
        warnings.warn(f"memgrad.{name} is deprecated and will be removed in the next release; use "
                      f"memgrad.{new} (the same object, renamed to say what it is)", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module 'memgrad' has no attribute {name!r}")
