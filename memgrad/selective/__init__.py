"""Selective differentiation: layers that keep only what the requested gradients need."""

from memgrad.selective.convert import ConversionReport, convert
from memgrad.selective.dropout import Dropout
from memgrad.selective.linear import Conv1D, Conv2D, Conv2DTranspose, Conv3D, Dense
from memgrad.selective.normalization import BatchNormalization
from memgrad.selective.pooling import MaxPooling2D
from memgrad.selective.relu import ReLU, masked_relu
from memgrad.selective.sequential import LeanSequential

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
