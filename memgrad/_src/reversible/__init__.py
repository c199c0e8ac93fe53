"""Reversible blocks: activation memory that does not grow with depth."""

from memgrad._src.reversible.base import ReversibleBlock
from memgrad._src.reversible.bijector import BijectorBlock
from memgrad._src.reversible.coupling import AdditiveCoupling, AffineCoupling
from memgrad._src.reversible.monitor import DriftMonitor, DriftWarning
from memgrad._src.reversible.flows import ActNorm, ChannelPermutation, Invertible1x1Conv, Squeeze
from memgrad._src.reversible.sequence import ReversibleSequence

__all__ = [
    "ActNorm",
    "AdditiveCoupling",
    "AffineCoupling",
    "BijectorBlock",
    "ChannelPermutation",
    "DriftMonitor",
    "DriftWarning",
    "Invertible1x1Conv",
    "ReversibleBlock",
    "ReversibleSequence",
    "Squeeze",
]
