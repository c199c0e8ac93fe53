"""MaxPooling2D that keeps the argmax of each window instead of its input and output."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.lean_layer import LeanLayer


@keras.saving.register_keras_serializable(package="memgrad")
class MaxPooling2D(LeanLayer, keras.layers.MaxPooling2D):
    """`keras.layers.MaxPooling2D` whose backward keeps one int32 index per output element.

    TensorFlow's max-pool gradient keeps the float input *and* output; the
    gradient needs only where each maximum came from. (Ties go to one position,
    as TensorFlow's own gradient does.) Channels-last only; other settings fall
    back to Keras's computation.

    Example:
      >>> pool = MaxPooling2D(2)
    """

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_applies(self, inputs, **kwargs):
        return self.data_format == "channels_last"

    def lean_forward(self, inputs, wanted, **kwargs):
        outputs, argmax = tf.nn.max_pool_with_argmax(
            inputs, ksize=list(self.pool_size), strides=list(self.strides), padding=self.padding.upper(),
            include_batch_in_index=True,
        )
        index_dtype = tf.int32 if inputs.shape.num_elements() < 2**31 else tf.int64
        argmax = tf.cast(argmax, index_dtype)
        input_shape = tf.shape(inputs, out_type=index_dtype)

        def backward(d_out):  # keeps the argmax (one index per output) and the input's shape
            flat = tf.scatter_nd(tf.reshape(argmax, [-1, 1]), tf.reshape(d_out, [-1]),
                                 tf.reduce_prod(input_shape, keepdims=True))
            return [tf.reshape(flat, input_shape)]

        return outputs, backward


def _channels_last_2d(layer, inputs):
    return layer.data_format == "channels_last" and inputs.shape.rank == 4


@keras.saving.register_keras_serializable(package="memgrad")
class GlobalAveragePooling2D(LeanLayer, keras.layers.GlobalAveragePooling2D):
    """`keras.layers.GlobalAveragePooling2D` whose backward keeps only the input's shape.

    TensorFlow's tape keeps the whole input of a mean for its gradient, which needs
    only the shape. Channels-last; otherwise Keras's computation.

    Example:
      >>> pool = GlobalAveragePooling2D()
    """

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_applies(self, inputs, **kwargs):
        return _channels_last_2d(self, inputs)

    def lean_backward(self, inputs, outputs, wanted):
        shape = tf.shape(inputs)  # keeps the input's shape only
        keepdims = self.keepdims

        def backward(d_out):
            if not keepdims:
                d_out = d_out[:, tf.newaxis, tf.newaxis, :]
            return [tf.broadcast_to(d_out / tf.cast(shape[1] * shape[2], d_out.dtype), shape)]

        return backward


@keras.saving.register_keras_serializable(package="memgrad")
class AveragePooling2D(LeanLayer, keras.layers.AveragePooling2D):
    """`keras.layers.AveragePooling2D` whose backward keeps only the input's shape.

    (TensorFlow's tape keeps the whole input.) Channels-last; otherwise Keras's computation.

    Example:
      >>> pool = AveragePooling2D(2)
    """

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_applies(self, inputs, **kwargs):
        return _channels_last_2d(self, inputs)

    def lean_backward(self, inputs, outputs, wanted):
        shape = tf.shape(inputs)  # keeps the input's shape only
        ksize, strides, padding = [1, *self.pool_size, 1], [1, *self.strides, 1], self.padding.upper()

        def backward(d_out):
            return [tf.raw_ops.AvgPoolGrad(orig_input_shape=shape, grad=d_out, ksize=ksize, strides=strides,
                                           padding=padding)]

        return backward
