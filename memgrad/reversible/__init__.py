"""Reversible blocks: activation memory that does not grow with depth."""

from memgrad.reversible.base import ReversibleBlock
from memgrad.reversible.bijector import BijectorBlock
from memgrad.reversible.coupling import AdditiveCoupling, AffineCoupling
from memgrad.reversible.flows import ActNorm, ChannelPermutation, Invertible1x1Conv, Squeeze
from memgrad.reversible.sequence import ReversibleSequence

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
