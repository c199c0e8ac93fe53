"""Selective differentiation: layers that keep only what the requested gradients need."""

from memgrad._src.selective.convert import ConversionReport, convert
from memgrad._src.selective.dropout import Dropout
from memgrad._src.selective.linear import Conv1D, Conv2D, Conv2DTranspose, Conv3D, Dense
from memgrad._src.selective.normalization import BatchNormalization
from memgrad._src.selective.pooling import MaxPooling2D
from memgrad._src.selective.relu import ReLU, masked_relu
from memgrad._src.selective.sequential import LeanSequential

__all__ = [
    "BatchNormalization",
    "ConversionReport",
    "Conv1D",
    "Conv2D",
    "Conv2DTranspose",
    "Conv3D",
    "Dense",
    "Dropout",
    "LeanSequential",
    "MaxPooling2D",
    "ReLU",
    "convert",
    "masked_relu",
]
