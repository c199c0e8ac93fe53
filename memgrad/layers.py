"""memgrad's Keras layers, in one namespace: ``memgrad.layers.ReversibleSequence`` and friends."""

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

__all__ = [
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
