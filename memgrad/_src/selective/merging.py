"""Add, Concatenate and ZeroPadding2D whose backward keeps shapes, not tensors."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.lean_layer import LeanLayer


class _LeanMerge(LeanLayer):
    """A merge of a list of inputs of one dtype and rank (others run Keras's computation)."""

    same_shape = False  # whether the lean path needs every input of one shape

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_applies(self, inputs, **kwargs):
        if not isinstance(inputs, list):
            return False
        shapes = {tuple(t.shape) for t in inputs}
        return (len({t.dtype for t in inputs}) == 1 and len({len(s) for s in shapes}) == 1
                and (len(shapes) == 1 or not self.same_shape))


@keras.saving.register_keras_serializable(package="memgrad")
class Add(_LeanMerge, keras.layers.Add):
    """`keras.layers.Add` whose backward keeps nothing.

    TensorFlow's tape keeps both inputs of every addition (for their shapes). Inputs
    of one shape and dtype; others (broadcasting) use Keras's computation.

    Example:
      >>> residual = Add()
    """

    same_shape = True

    def lean_backward(self, inputs, outputs, wanted):
        count = len(inputs)
        return lambda d_out: [d_out] * count


@keras.saving.register_keras_serializable(package="memgrad")
class Concatenate(_LeanMerge, keras.layers.Concatenate):
    """`keras.layers.Concatenate` whose backward keeps only the inputs' sizes along the axis.

    (TensorFlow's tape keeps every input of a concatenation.)

    Example:
      >>> merge = Concatenate(axis=-1)
    """

    def lean_backward(self, inputs, outputs, wanted):
        axis = self.axis
        sizes = tf.stack([tf.shape(t)[axis] for t in inputs])
        return lambda d_out: tf.split(d_out, sizes, axis=axis)


@keras.saving.register_keras_serializable(package="memgrad")
class ZeroPadding2D(LeanLayer, keras.layers.ZeroPadding2D):
    """`keras.layers.ZeroPadding2D` whose backward keeps nothing (TensorFlow's keeps the input).

    Example:
      >>> pad = ZeroPadding2D(((3, 3), (3, 3)))
    """

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_backward(self, inputs, outputs, wanted):
        (top, _), (left, _) = self.padding
        shape = tf.shape(inputs)  # keeps the input's shape only
        begin = [0, top, left, 0] if self.data_format == "channels_last" else [0, 0, top, left]

        def backward(d_out):
            return [tf.slice(d_out, begin, shape)]

        return backward
