"""Selective differentiation (Bhatia & Dangel): layers that keep only what the requested
gradients need, and `convert`, which swaps them into an existing Keras model.

These layers carry Keras's names and compute the same outputs as the Keras layers of the
same name; they differ in what they keep for backprop (a frozen layer keeps nothing for its
weights; `ReLU` keeps a 1-byte mask).

Example:
  ```python
  import keras
  import memgrad

  model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(10)])
  lean, report = memgrad.selective.convert(model, return_report=True)
  ```
"""

from memgrad._src.selective import (
    Activation,
    Add,
    AveragePooling2D,
    BatchNormalization,
    Concatenate,
    ConversionReport,
    Conv1D,
    Conv2D,
    Conv2DTranspose,
    Conv3D,
    Dense,
    DepthwiseConv2D,
    Dropout,
    EinsumDense,
    Embedding,
    GlobalAveragePooling2D,
    LayerNormalization,
    LeanFunctional,
    LeanSequential,
    MaxPooling2D,
    ReLU,
    SeparableConv2D,
    ZeroPadding2D,
    convert,
    lean_gelu,
    masked_relu,
)

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
