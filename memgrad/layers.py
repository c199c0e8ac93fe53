"""memgrad's Keras layers: reversible blocks, the checkpointing markers and `Recompute`.

The selective-differentiation layers share Keras's names (``Dense``, ``Conv2D``, ...) while
being different layers, so they live in their own namespace, `memgrad.selective`.

Example:
  ```python
  import keras
  import memgrad

  blocks = [memgrad.layers.AdditiveCoupling(keras.layers.Dense(32), keras.layers.Dense(32))
            for _ in range(8)]
  stack = memgrad.layers.ReversibleSequence(blocks)   # activation memory flat in depth
  ```
"""

from memgrad._src.checkpointing.marker import Checkpoint
from memgrad._src.recompute import Recompute
from memgrad._src.reversible import (
    ActNorm,
    AdditiveCoupling,
    AffineCoupling,
    BijectorBlock,
    ChannelPermutation,
    DriftMonitor,
    DriftWarning,
    Invertible1x1Conv,
    ReversibleBlock,
    ReversibleSequence,
    Squeeze,
)

__all__ = [
    "ActNorm",
    "AdditiveCoupling",
    "AffineCoupling",
    "BijectorBlock",
    "ChannelPermutation",
    "Checkpoint",
    "DriftMonitor",
    "DriftWarning",
    "Invertible1x1Conv",
    "Recompute",
    "ReversibleBlock",
    "ReversibleSequence",
    "Squeeze",
]
