"""Selective differentiation (Bhatia & Dangel): layers that keep only what the requested
gradients need, and `convert`, which swaps them into an existing Keras model.

These layers carry Keras's names and compute the same outputs as the Keras layers of the
same name; they differ in what they keep for backprop (a frozen layer keeps nothing for its
weights; `ReLU` keeps a 1-byte mask). `LeanLayer` is the base to subclass for a layer of
your own (docs/design.md shows one).

Example:
  ```python
  import keras
  import memgrad

  model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(10)])
  lean, report = memgrad.selective.convert(model, return_report=True)
  ```
"""

from memgrad._src.selective import *  # noqa: F401,F403 - the layers registered in registry.LAYERS
from memgrad._src.selective import __all__  # noqa: F401
