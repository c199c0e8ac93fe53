"""Dropout that keeps its random seed, not its mask, and regenerates the mask in backprop."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.lean_layer import LeanLayer


def _as_int32_seed(seed):
    # Keras's seed state is int64; TensorFlow's stateless ops take int32 (as Keras does).
    if seed.dtype == tf.int32:
        return seed
    return tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)


@keras.saving.register_keras_serializable(package="memgrad")
class Dropout(LeanLayer, keras.layers.Dropout):
    """`keras.layers.Dropout` whose backward keeps a 2-integer seed instead of a mask.

    The same mask as ``keras.layers.Dropout`` with the same seed state; in the
    backward pass the mask is drawn again from the kept seed.

    Example:
      >>> drop = Dropout(0.5, seed=1)
    """

    def call(self, inputs, training=False):
        return self.lean_call(inputs, training=training)

    def lean_applies(self, inputs, training=False):
        return bool(training) and 0.0 < self.rate < 1.0

    def lean_forward(self, inputs, wanted, training=False):
        seed = _as_int32_seed(self.seed_generator.next())
        noise_shape = None
        if self.noise_shape is not None:
            noise_shape = [inputs.shape[i] if d is None else d for i, d in enumerate(self.noise_shape)]
        rate = self.rate

        def dropped(t):
            return tf.nn.experimental.stateless_dropout(t, rate=rate, noise_shape=noise_shape, seed=seed)

        return dropped(inputs), lambda d_out: [dropped(d_out)]  # keeps the seed only
