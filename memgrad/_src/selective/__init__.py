"""Selective differentiation: layers that keep only what the requested gradients need."""

from memgrad._src.selective.activation import Activation, lean_gelu
from memgrad._src.selective.convert import ConversionReport, convert
from memgrad._src.selective.depthwise import DepthwiseConv2D, SeparableConv2D
from memgrad._src.selective.dropout import Dropout
from memgrad._src.selective.einsum import EinsumDense
from memgrad._src.selective.embedding import Embedding
from memgrad._src.selective.functional import LeanFunctional
from memgrad._src.selective.linear import Conv1D, Conv2D, Conv2DTranspose, Conv3D, Dense
from memgrad._src.selective.merging import Add, Concatenate, ZeroPadding2D
from memgrad._src.selective.normalization import BatchNormalization, LayerNormalization
from memgrad._src.selective.pooling import AveragePooling2D, GlobalAveragePooling2D, MaxPooling2D
from memgrad._src.selective.relu import ReLU, masked_relu
from memgrad._src.selective.sequential import LeanSequential

__all__ = [
    "Activation",
    "Add",
    "AveragePooling2D",
    "BatchNormalization",
    "Concatenate",
    "ConversionReport",
    "Conv1D",
    "Conv2D",
    "Conv2DTranspose",
    "Conv3D",
    "Dense",
    "DepthwiseConv2D",
    "Dropout",
    "EinsumDense",
    "Embedding",
    "GlobalAveragePooling2D",
    "LayerNormalization",
    "LeanFunctional",
    "LeanSequential",
    "MaxPooling2D",
    "ReLU",
    "SeparableConv2D",
    "ZeroPadding2D",
    "convert",
    "lean_gelu",
    "masked_relu",
]
