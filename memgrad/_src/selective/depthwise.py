"""Depthwise and separable convolutions that keep their input only for a trainable kernel."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.linear import SelectiveLinear, reject_unsupported
from memgrad._src.selective.relu import share_kept_input


@keras.saving.register_keras_serializable(package="memgrad")
class DepthwiseConv2D(SelectiveLinear, keras.layers.DepthwiseConv2D):
    """`keras.layers.DepthwiseConv2D` that keeps its input only when its kernel is trainable.

    Same constructor arguments and weights as ``keras.layers.DepthwiseConv2D``
    (channels-last, 'valid'/'same' padding, no dilation; `convert` leaves other
    settings to Keras and lists them in its report). TensorFlow's tape keeps the
    input of every depthwise convolution, frozen or not.

    Example:
      >>> depthwise = DepthwiseConv2D(3, padding="same", trainable=False)
    """

    def _check_supported(self):
        reject_unsupported(self, "any depth_multiplier", [])

    def _input_gradient(self, d_pre, kernel, input_shape):
        return tf.nn.depthwise_conv2d_backprop_input(
            input_shape, tf.cast(kernel, d_pre.dtype), d_pre, strides=[1, *self.strides, 1],
            padding=self.padding.upper())

    def _kernel_gradient(self, inputs, d_pre, kernel_shape):
        return tf.nn.depthwise_conv2d_backprop_filter(
            inputs, kernel_shape, tf.cast(d_pre, inputs.dtype), strides=[1, *self.strides, 1],
            padding=self.padding.upper())


@keras.saving.register_keras_serializable(package="memgrad")
class SeparableConv2D(SelectiveLinear, keras.layers.SeparableConv2D):
    """`keras.layers.SeparableConv2D` that keeps its input only when its kernels are trainable.

    A separable convolution is a depthwise convolution followed by a 1x1 one. Its
    backward keeps the input only when the kernel gradients may be requested, and
    then recomputes the depthwise result from it instead of keeping that too
    (TensorFlow's tape keeps both, frozen or not). Channels-last, 'valid'/'same'
    padding, no dilation.

    Example:
      >>> separable = SeparableConv2D(32, 3, padding="same", activation="relu", trainable=False)
    """

    def _check_supported(self):
        reject_unsupported(self, "any depth_multiplier", [])

    def lean_weights(self):
        return [self.depthwise_kernel, self.pointwise_kernel] + ([self.bias] if self.use_bias else [])

    def lean_backward(self, inputs, pre, wanted):
        kept_input = inputs if wanted.weights else None  # the input, for the kernels' gradients
        if kept_input is not None:
            share_kept_input(kept_input)
        depthwise = tf.convert_to_tensor(self.depthwise_kernel.value)
        pointwise = tf.convert_to_tensor(self.pointwise_kernel.value)
        input_shape = tf.shape(inputs)
        strides = [1, *self.strides, 1]
        padding = self.padding.upper()
        use_bias = self.use_bias

        def backward(d_pre):
            dtype = d_pre.dtype
            # The 1x1 convolution: d_mid = d_pre . pointwise^T.
            d_mid = tf.tensordot(d_pre, tf.cast(pointwise[0, 0], dtype), [[3], [1]])
            grads = [tf.nn.depthwise_conv2d_backprop_input(
                input_shape, tf.cast(depthwise, dtype), d_mid, strides, padding) if wanted.inputs else None]
            if wanted.weights:
                mid = tf.nn.depthwise_conv2d(kept_input, tf.cast(depthwise, kept_input.dtype), strides,
                                             padding)  # recomputed
                d_pointwise = tf.tensordot(mid, tf.cast(d_pre, mid.dtype), [[0, 1, 2], [0, 1, 2]])
                grads.append(tf.nn.depthwise_conv2d_backprop_filter(
                    kept_input, tf.shape(depthwise), tf.cast(d_mid, kept_input.dtype), strides, padding))
                grads.append(d_pointwise[tf.newaxis, tf.newaxis])
                if use_bias:
                    grads.append(tf.reduce_sum(d_pre, axis=[0, 1, 2]))
            return grads

        return backward
