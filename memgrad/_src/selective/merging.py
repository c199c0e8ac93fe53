"""Add, Concatenate and ZeroPadding2D whose backward keeps shapes, not tensors."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.tape import OneInputLean, is_watched, record_backward, stop_recording


def _lean_merge(layer, inputs, super_call, backward_for, same_shape):
    """Runs ``super_call(inputs)`` unrecorded and records ``backward_for(tensors)`` for it,
    or returns ``None`` when Keras's computation should run (graph, broadcasting or reshaping
    merge, mixed dtypes, no tape watching an input)."""
    if not (tf.executing_eagerly() and isinstance(inputs, (list, tuple))):
        return None
    tensors = [tf.convert_to_tensor(t) for t in inputs]
    shapes = {tuple(t.shape) for t in tensors}
    if (len({t.dtype for t in tensors}) != 1 or len({len(s) for s in shapes}) != 1
            or (same_shape and len(shapes) != 1) or not any(is_watched(t) for t in tensors)):
        return None
    with stop_recording():
        outputs = super_call(tensors)
    record_backward(f"memgrad_{type(layer).__name__}", outputs, tensors, backward_for(tensors))
    return outputs


@keras.saving.register_keras_serializable(package="memgrad")
class Add(keras.layers.Add):
    """`keras.layers.Add` whose backward keeps nothing.

    TensorFlow's tape keeps both inputs of every addition (for their shapes). Inputs
    of one shape and dtype; others (broadcasting) use Keras's computation.

    Example:
      >>> residual = Add()
    """

    def call(self, inputs):
        outputs = _lean_merge(self, inputs, super().call, lambda tensors: lambda d_out: [d_out] * len(tensors),
                              same_shape=True)
        return super().call(inputs) if outputs is None else outputs


@keras.saving.register_keras_serializable(package="memgrad")
class Concatenate(keras.layers.Concatenate):
    """`keras.layers.Concatenate` whose backward keeps only the inputs' sizes along the axis.

    (TensorFlow's tape keeps every input of a concatenation.)

    Example:
      >>> merge = Concatenate(axis=-1)
    """

    def call(self, inputs):
        axis = self.axis

        def backward_for(tensors):
            sizes = tf.stack([tf.shape(t)[axis] for t in tensors])
            return lambda d_out: tf.split(d_out, sizes, axis=axis)

        outputs = _lean_merge(self, inputs, super().call, backward_for, same_shape=False)
        return super().call(inputs) if outputs is None else outputs


@keras.saving.register_keras_serializable(package="memgrad")
class ZeroPadding2D(OneInputLean, keras.layers.ZeroPadding2D):
    """`keras.layers.ZeroPadding2D` whose backward keeps nothing (TensorFlow's keeps the input).

    Example:
      >>> pad = ZeroPadding2D(((3, 3), (3, 3)))
    """

    def call(self, inputs):
        return self._lean_call(inputs)

    def lean_backward(self, inputs, outputs):
        (top, _), (left, _) = self.padding
        shape = tf.shape(inputs)  # keeps the input's shape only
        begin = [0, top, left, 0] if self.data_format == "channels_last" else [0, 0, top, left]

        def backward(d_out):
            return [tf.slice(d_out, begin, shape)]

        return backward
