"""memgrad's Keras layers in one namespace: reversible blocks, selective-differentiation layers
and the `Checkpoint` marker for `checkpoints='collection'`.

The selective layers share Keras's names (``Dense``, ``Conv2D``, ...) and are also
reachable as ``memgrad.selective.Dense`` etc.
"""

from memgrad.checkpointing.keras_hook import Checkpoint

from memgrad.reversible import (
    ActNorm,
    AdditiveCoupling,
    AffineCoupling,
    BijectorBlock,
    ChannelPermutation,
    Invertible1x1Conv,
    ReversibleBlock,
    ReversibleSequence,
    Squeeze,
)

from memgrad.selective import (
    BatchNormalization,
    Conv1D,
    Conv2D,
    Conv2DTranspose,
    Conv3D,
    Dense,
    Dropout,
    LeanSequential,
    MaxPooling2D,
    ReLU,
)

__all__ = [
    "BatchNormalization",
    "Checkpoint",
    "Conv1D",
    "Conv2D",
    "Conv2DTranspose",
    "Conv3D",
    "Dense",
    "Dropout",
    "LeanSequential",
    "MaxPooling2D",
    "ReLU",
    "ActNorm",
    "AdditiveCoupling",
    "AffineCoupling",
    "BijectorBlock",
    "ChannelPermutation",
    "Invertible1x1Conv",
    "ReversibleBlock",
    "ReversibleSequence",
    "Squeeze",
]
