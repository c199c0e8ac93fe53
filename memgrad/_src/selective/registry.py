"""The selective layers, registered once.

`LAYERS` lists every drop-in layer: each subclasses the Keras layer of its own name and
computes the same outputs. memgrad.selective's names and `convert`'s replacement table are
read from here, so a new layer is one entry (and its contract case in
tests/selective/test_layers.py, which a test asks for).
"""

from __future__ import annotations

import keras

from memgrad._src.selective.activation import Activation
from memgrad._src.selective.depthwise import DepthwiseConv2D, SeparableConv2D
from memgrad._src.selective.dropout import Dropout
from memgrad._src.selective.einsum import EinsumDense
from memgrad._src.selective.embedding import Embedding
from memgrad._src.selective.linear import Conv1D, Conv2D, Conv2DTranspose, Conv3D, Dense
from memgrad._src.selective.merging import Add, Concatenate, ZeroPadding2D
from memgrad._src.selective.normalization import BatchNormalization, LayerNormalization
from memgrad._src.selective.pooling import AveragePooling2D, GlobalAveragePooling2D, MaxPooling2D
from memgrad._src.selective.relu import ReLU

LAYERS = (
    Activation, Add, AveragePooling2D, BatchNormalization, Concatenate, Conv1D, Conv2D,
    Conv2DTranspose, Conv3D, Dense, DepthwiseConv2D, Dropout, EinsumDense, Embedding,
    GlobalAveragePooling2D, LayerNormalization, MaxPooling2D, ReLU, SeparableConv2D, ZeroPadding2D,
)


def keras_counterpart(layer_class):
    """The Keras layer class ``layer_class`` replaces: the base class of the same name from
    ``keras.layers``, or a `TypeError` naming what was received."""
    keras_class = getattr(keras.layers, layer_class.__name__, None)
    if keras_class is None or keras_class not in layer_class.__mro__[1:]:
        raise TypeError(f"a selective layer subclasses the keras.layers class of its own name; "
                        f"{layer_class.__module__}.{layer_class.__qualname__} does not")
    return keras_class
