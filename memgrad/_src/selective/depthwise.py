"""Depthwise and separable convolutions that keep their input only for a trainable kernel."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.activation import apply_activation
from memgrad._src.selective.linear import SelectiveLinear, _merged_kernel, _reject_unsupported
from memgrad._src.selective.relu import share_kept_input
from memgrad._src.selective.tape import is_watched, record_backward, stop_recording, watched_read, weights_wanted


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
        _reject_unsupported(self, "any depth_multiplier", [])

    def _input_gradient(self, d_pre, kernel, input_shape):
        return tf.nn.depthwise_conv2d_backprop_input(
            input_shape, tf.cast(kernel, d_pre.dtype), d_pre, strides=[1, *self.strides, 1],
            padding=self.padding.upper())

    def _kernel_gradient(self, inputs, d_pre, kernel_shape):
        return tf.nn.depthwise_conv2d_backprop_filter(
            inputs, kernel_shape, tf.cast(d_pre, inputs.dtype), strides=[1, *self.strides, 1],
            padding=self.padding.upper())


@keras.saving.register_keras_serializable(package="memgrad")
class SeparableConv2D(keras.layers.SeparableConv2D):
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
        _reject_unsupported(self, "any depth_multiplier", [])

    def build(self, input_shape):
        self._check_supported()
        super().build(input_shape)

    def _depthwise(self, x, depthwise_kernel):
        return tf.nn.depthwise_conv2d(x, depthwise_kernel, [1, *self.strides, 1], self.padding.upper())

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if not tf.executing_eagerly() or _merged_kernel(self):
            return super().call(inputs)
        variables = [self.depthwise_kernel, self.pointwise_kernel] + ([self.bias] if self.use_bias else [])
        kernels_wanted = weights_wanted(self, variables)
        input_wanted = is_watched(inputs)
        activation, self.activation = self.activation, keras.activations.linear
        try:
            with stop_recording():
                pre = super().call(inputs)
        finally:
            self.activation = activation
        if kernels_wanted or input_wanted:
            self._record(pre, inputs, variables, kernels_wanted, input_wanted)
        return apply_activation(self.activation, pre)

    def _record(self, pre, inputs, variables, kernels_wanted, input_wanted):
        reads = [watched_read(v) for v in variables] if kernels_wanted else []
        kept_input = inputs if kernels_wanted else None
        if kept_input is not None:
            share_kept_input(kept_input)
        with stop_recording():
            depthwise = tf.convert_to_tensor(self.depthwise_kernel.value)
            pointwise = tf.convert_to_tensor(self.pointwise_kernel.value)
        input_shape = tf.shape(inputs)
        strides = [1, *self.strides, 1]
        padding = self.padding.upper()

        def backward(d_pre):
            dtype = d_pre.dtype
            # The 1x1 convolution: d_mid = d_pre . pointwise^T.
            d_mid = tf.tensordot(d_pre, tf.cast(pointwise[0, 0], dtype), [[3], [1]])
            grads = [tf.nn.depthwise_conv2d_backprop_input(
                input_shape, tf.cast(depthwise, dtype), d_mid, strides, padding) if input_wanted else None]
            if kernels_wanted:
                mid = self._depthwise(kept_input, tf.cast(depthwise, kept_input.dtype))  # recomputed
                d_pointwise = tf.tensordot(mid, tf.cast(d_pre, mid.dtype), [[0, 1, 2], [0, 1, 2]])
                grads.append(tf.nn.depthwise_conv2d_backprop_filter(
                    kept_input, tf.shape(depthwise), tf.cast(d_mid, kept_input.dtype), strides, padding))
                grads.append(d_pointwise[tf.newaxis, tf.newaxis])
                if self.use_bias:
                    grads.append(tf.reduce_sum(d_pre, axis=[0, 1, 2]))
            return grads

        record_backward("memgrad_SeparableConv2D", pre, [inputs] + reads, backward)
