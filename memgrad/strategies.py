"""Checkpoint strategies: policy objects sharing one protocol, ``plan(view) -> CheckpointPlan``.

Pass one as ``checkpoints=`` to `memgrad.gradients`, `memgrad.GradientTape`,
`memgrad.enable_checkpointing` or `memgrad.analyze`. The strings ``'memory'``, ``'speed'`` and
``'collection'`` are aliases for `Memory()`, `Speed()` and `Collection()`; a list of tensors
is an alias for `Tensors(list)`.

Example:
  ```python
  import memgrad

  with memgrad.GradientTape(checkpoints=memgrad.strategies.Budget("2GiB")) as tape:
      loss = loss_fn(model(x))
  grads = tape.gradient(loss, model.trainable_variables)
  ```
"""

from memgrad._src.checkpointing.budget import Budget, CurvePoint
from memgrad._src.graph.view import ForwardGraph
from memgrad._src.checkpointing.strategies import (
    CheckpointPlan,
    Collection,
    Memory,
    Speed,
    Strategy,
    Tensors,
    as_strategy,
)

__all__ = [
    "Budget",
    "CheckpointPlan",
    "Collection",
    "CurvePoint",
    "ForwardGraph",
    "Memory",
    "Speed",
    "Strategy",
    "Tensors",
    "as_strategy",
]
