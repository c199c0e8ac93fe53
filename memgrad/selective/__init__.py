"""Selective differentiation: layers that keep only what the requested gradients need."""

from memgrad.selective.convert import ConversionReport, convert
from memgrad.selective.linear import Conv1D, Conv2D, Conv3D, Dense
from memgrad.selective.normalization import BatchNormalization
from memgrad.selective.relu import ReLU, masked_relu
from memgrad.selective.sequential import LeanSequential

__all__ = [
    "BatchNormalization",
    "ConversionReport",
    "Conv1D",
    "Conv2D",
    "Conv3D",
    "Dense",
    "LeanSequential",
    "ReLU",
    "convert",
    "masked_relu",
]
