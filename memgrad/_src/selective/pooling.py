"""MaxPooling2D that keeps the argmax of each window instead of its input and output."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.tape import is_watched, record_backward, stop_recording


@keras.saving.register_keras_serializable(package="memgrad")
class MaxPooling2D(keras.layers.MaxPooling2D):
    """`keras.layers.MaxPooling2D` whose backward keeps one int32 index per output element.

    TensorFlow's max-pool gradient keeps the float input *and* output; the
    gradient needs only where each maximum came from. (Ties go to one position,
    as TensorFlow's own gradient does.) Channels-last only; other settings fall
    back to Keras's computation.

    Example:
      >>> pool = MaxPooling2D(2)
    """

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if not (tf.executing_eagerly() and self.data_format == "channels_last" and is_watched(inputs)):
            return super().call(inputs)
        with stop_recording():
            outputs, argmax = tf.nn.max_pool_with_argmax(
                inputs, ksize=list(self.pool_size), strides=list(self.strides), padding=self.padding.upper(),
                include_batch_in_index=True,
            )
            index_dtype = tf.int32 if inputs.shape.num_elements() < 2**31 else tf.int64
            argmax = tf.cast(argmax, index_dtype)
        input_shape = tf.shape(inputs, out_type=index_dtype)

        def backward(d_out):
            flat = tf.scatter_nd(tf.reshape(argmax, [-1, 1]), tf.reshape(d_out, [-1]),
                                 tf.reduce_prod(input_shape, keepdims=True))
            return [tf.reshape(flat, input_shape)]

        record_backward("memgrad_MaxPool", outputs, [inputs], backward)
        return outputs


def _channels_last_2d(layer, inputs):
    return layer.data_format == "channels_last" and inputs.shape.rank == 4


@keras.saving.register_keras_serializable(package="memgrad")
class GlobalAveragePooling2D(keras.layers.GlobalAveragePooling2D):
    """`keras.layers.GlobalAveragePooling2D` whose backward keeps only the input's shape.

    TensorFlow's tape keeps the whole input of a mean for its gradient, which needs
    only the shape. Channels-last; otherwise Keras's computation.

    Example:
      >>> pool = GlobalAveragePooling2D()
    """

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if not (tf.executing_eagerly() and _channels_last_2d(self, inputs) and is_watched(inputs)):
            return super().call(inputs)
        with stop_recording():
            outputs = super().call(inputs)
        shape = tf.shape(inputs)
        keepdims = self.keepdims

        def backward(d_out):
            if not keepdims:
                d_out = d_out[:, tf.newaxis, tf.newaxis, :]
            return [tf.broadcast_to(d_out / tf.cast(shape[1] * shape[2], d_out.dtype), shape)]

        record_backward("memgrad_GlobalAveragePool", outputs, [inputs], backward)
        return outputs


@keras.saving.register_keras_serializable(package="memgrad")
class AveragePooling2D(keras.layers.AveragePooling2D):
    """`keras.layers.AveragePooling2D` whose backward keeps only the input's shape.

    (TensorFlow's tape keeps the whole input.) Channels-last; otherwise Keras's computation.

    Example:
      >>> pool = AveragePooling2D(2)
    """

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if not (tf.executing_eagerly() and _channels_last_2d(self, inputs) and is_watched(inputs)):
            return super().call(inputs)
        with stop_recording():
            outputs = super().call(inputs)
        shape = tf.shape(inputs)
        ksize, strides, padding = [1, *self.pool_size, 1], [1, *self.strides, 1], self.padding.upper()

        def backward(d_out):
            return [tf.raw_ops.AvgPoolGrad(orig_input_shape=shape, grad=d_out, ksize=ksize, strides=strides,
                                           padding=padding)]

        record_backward("memgrad_AveragePool", outputs, [inputs], backward)
        return outputs
