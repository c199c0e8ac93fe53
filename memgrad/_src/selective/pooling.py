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
