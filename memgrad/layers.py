"""memgrad's Keras layers in one namespace: reversible blocks and the selective-differentiation layers.

The selective layers share Keras's names (``Dense``, ``Conv2D``, ...) and are also
reachable as ``memgrad.selective.Dense`` etc.
"""

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

from memgrad.selective import BatchNormalization, Conv1D, Conv2D, Conv3D, Dense, LeanSequential, ReLU

__all__ = [
    "BatchNormalization",
    "Conv1D",
    "Conv2D",
    "Conv3D",
    "Dense",
    "LeanSequential",
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
