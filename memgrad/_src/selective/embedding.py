"""Embedding that records nothing when its table is frozen."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.tape import stop_recording, weights_wanted


@keras.saving.register_keras_serializable(package="memgrad")
class Embedding(keras.layers.Embedding):
    """`keras.layers.Embedding` that, frozen, leaves its lookup off the tape.

    Keras reads the table as a watched variable even when the layer is frozen, so
    TensorFlow's tape records the lookup and everything computed from its output
    (a frozen encoder's first layers included). Frozen and not watched
    (``tape.watch(layer.embeddings.value)``), this layer's output is a plain
    tensor: layers after it keep nothing for a gradient no one can ask for.

    Example:
      >>> tokens = Embedding(1000, 64, trainable=False)
    """

    def call(self, inputs):
        if tf.executing_eagerly() and not getattr(self, "lora_enabled", False) and not weights_wanted(
                self, [self.embeddings]):
            with stop_recording():
                return super().call(inputs)
        return super().call(inputs)
