"""Embedding whose backward keeps only the token ids, and records nothing when frozen."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.lean_layer import LeanLayer, computed_weights


@keras.saving.register_keras_serializable(package="memgrad")
class Embedding(LeanLayer, keras.layers.Embedding):
    """`keras.layers.Embedding` that, frozen, leaves its lookup off the tape.

    Keras reads the table as a watched variable even when the layer is frozen, so
    TensorFlow's tape records the lookup and everything computed from its output
    (a frozen encoder's first layers included). Frozen and not watched
    (``tape.watch(layer.embeddings.value)``), this layer's output is a plain
    tensor: layers after it keep nothing for a gradient no one can ask for.
    Trainable, its backward keeps the token ids only and returns the table's
    gradient as ``tf.IndexedSlices``, as TensorFlow's gather does. A LoRA-enabled
    or quantized layer runs Keras's computation.

    Example:
      >>> tokens = Embedding(1000, 64, trainable=False)
    """

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_applies(self, inputs):
        return not computed_weights(self)

    def lean_weights(self):
        return [self.embeddings]

    def lean_backward(self, inputs, outputs, wanted):
        if not wanted.weights:
            return lambda d_out: [None]
        ids = tf.reshape(inputs if inputs.dtype in (tf.int32, tf.int64) else tf.cast(inputs, tf.int32), [-1])
        table = self.embeddings
        rows = tf.shape(table.value, out_type=ids.dtype)

        def backward(d_out):  # keeps the ids (and the table's shape)
            values = tf.cast(tf.reshape(d_out, [-1, rows[1]]), table.dtype)
            return [None, tf.IndexedSlices(values, ids, rows)]

        return backward
