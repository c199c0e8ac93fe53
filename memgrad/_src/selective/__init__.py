"""Selective differentiation: layers that keep only what the requested gradients need.

The drop-in layers are registered once, in `registry.LAYERS`; the names below are read from
there.
"""

from memgrad._src.selective.activation import lean_gelu
from memgrad._src.selective.convert import ConversionReport, convert
from memgrad._src.selective.functional import LeanFunctional
from memgrad._src.selective.lean_layer import LeanLayer
from memgrad._src.selective.registry import LAYERS
from memgrad._src.selective.relu import masked_relu
from memgrad._src.selective.sequential import LeanSequential

globals().update({layer.__name__: layer for layer in LAYERS})

__all__ = sorted([layer.__name__ for layer in LAYERS] + [
    "ConversionReport", "LeanFunctional", "LeanLayer", "LeanSequential", "convert", "lean_gelu",
    "masked_relu"])
