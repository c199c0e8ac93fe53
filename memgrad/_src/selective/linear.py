"""Dense and convolution layers that keep their input only if the kernel gradient is wanted."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.activation import apply_activation
from memgrad._src.selective.relu import share_kept_input
from memgrad._src.selective.lean_layer import LeanLayer, computed_weights


class SelectiveLinear(LeanLayer):
    """Base of the Keras layers linear in their input and in each of their weights.

    In eager mode under a tape, the layer records one operation whose backward
    keeps the layer's input only if the kernel gradient may be requested, and the
    kernel only if the input needs a gradient. The kernel gradient may be
    requested if the layer is trainable or if a tape watched the kernel before the
    call (``tape.watch(layer.kernel.value)``): that is how to get a frozen layer's
    kernel gradient in eager mode, since a frozen layer called without it keeps no
    input and ``tape.gradient`` returns ``None`` for its weights. Inside
    ``tf.function`` TensorFlow's own gradient pruning already drops what is not
    needed, so `keras_call` (Keras's computation, or a subclass's equal one) runs
    there unrecorded and every gradient is available. The operation recorded is the linear part; the activation after it
    runs through its lean version (`apply_activation`).

    A subclass defines ``_input_gradient`` and ``_kernel_gradient`` (or its own
    `lean_backward`).
    """

    def _check_supported(self):
        """Raises ValueError if this configuration is not handled (subclasses override)."""

    def build(self, input_shape):
        self._check_supported()
        super().build(input_shape)

    def lean_weights(self):
        """The kernel, then the bias if there is one."""
        return [self.kernel] + ([self.bias] if self.use_bias else [])

    def _bias_gradient(self, d_pre):
        return tf.reduce_sum(d_pre, axis=list(range(d_pre.shape.rank - 1)))

    def keras_call(self, inputs):
        """Keras's computation without the activation."""
        activation, self.activation = self.activation, keras.activations.linear
        try:
            return super().keras_call(inputs)
        finally:
            self.activation = activation

    def call(self, inputs, training=None):  # `training` as Keras's Dense/EinsumDense take it (unused)
        if computed_weights(self):  # a LoRA or quantized kernel is not one variable
            return super().call(inputs)
        if not tf.executing_eagerly():  # graph gradients already prune unneeded inputs
            return apply_activation(self.activation, self.keras_call(inputs))
        return apply_activation(self.activation, self.lean_call(inputs))

    def lean_backward(self, inputs, pre, wanted):
        kept_input = inputs if wanted.weights else None  # the input, for the kernel gradient
        if kept_input is not None:
            share_kept_input(kept_input)
        kernel = tf.convert_to_tensor(self.kernel.value) if wanted.inputs else None  # for the input's
        input_shape = tf.shape(inputs)
        kernel_shape = tf.shape(self.kernel.value)
        has_bias = len(self.lean_weights()) > 1

        def backward(d_pre):
            grads = [self._input_gradient(d_pre, kernel, input_shape) if wanted.inputs else None]
            if wanted.weights:
                grads.append(self._kernel_gradient(kept_input, d_pre, kernel_shape))
                if has_bias:
                    grads.append(self._bias_gradient(d_pre))
            return grads

        return backward


@keras.saving.register_keras_serializable(package="memgrad")
class Dense(SelectiveLinear, keras.layers.Dense):
    """`keras.layers.Dense` that keeps its input only when its kernel is trainable.

    Same constructor arguments and weights as ``keras.layers.Dense``. A frozen
    layer's kernel gradient, in eager mode, needs ``tape.watch(layer.kernel.value)``
    before the call (see `SelectiveLinear`).

    Example:
      >>> layer = Dense(64, activation="relu")
      >>> layer.trainable = False   # the input is no longer kept for backprop
    """

    def _input_gradient(self, d_pre, kernel, input_shape):
        return tf.tensordot(d_pre, tf.cast(kernel, d_pre.dtype), [[d_pre.shape.rank - 1], [1]])

    def _kernel_gradient(self, inputs, d_pre, kernel_shape):
        flat_in = tf.reshape(inputs, [-1, tf.shape(inputs)[-1]])
        flat_d = tf.reshape(d_pre, [-1, tf.shape(d_pre)[-1]])
        return tf.matmul(flat_in, tf.cast(flat_d, flat_in.dtype), transpose_a=True)


def reject_unsupported(layer, extra_requirement, extra_problems):
    """Raises ValueError naming every convolution setting the selective backward does not handle."""
    problems = []
    if layer.data_format != "channels_last":
        problems.append(f"data_format={layer.data_format!r}")
    if layer.padding not in ("valid", "same"):
        problems.append(f"padding={layer.padding!r}")
    if any(rate != 1 for rate in layer.dilation_rate):
        # TensorFlow's CPU kernels for the input gradient reject dilation > 1.
        problems.append(f"dilation_rate={tuple(layer.dilation_rate)}")
    problems += extra_problems
    if problems:
        raise ValueError(
            f"memgrad's {type(layer).__name__} supports channels_last, 'valid' or 'same' padding, "
            f"dilation_rate=1 and {extra_requirement}. Received: {', '.join(problems)}"
        )


class SelectiveConv(SelectiveLinear):
    """Shared backward of Conv1D/2D/3D (channels-last, 'valid'/'same' padding, groups=1, no dilation)."""

    def _check_supported(self):
        reject_unsupported(self, "groups=1", [f"groups={self.groups}"] if self.groups != 1 else [])

    def _spatial(self, values):
        return [1] + list(values) + [1]

    def _input_gradient(self, d_pre, kernel, input_shape):
        return tf.nn.conv_transpose(
            d_pre, tf.cast(kernel, d_pre.dtype), output_shape=input_shape, strides=list(self.strides),
            padding=self.padding.upper(),
        )

    def _kernel_gradient(self, inputs, d_pre, kernel_shape):
        rank = len(self.kernel_size)
        d_pre = tf.cast(d_pre, inputs.dtype)
        strides = list(self.strides)
        if rank == 1:  # as a 2D convolution of height 1
            inputs, d_pre = tf.expand_dims(inputs, 1), tf.expand_dims(d_pre, 1)
            kernel_shape = tf.concat([[1], kernel_shape], axis=0)
            strides = [1] + strides
        backprop = tf.raw_ops.Conv3DBackpropFilterV2 if rank == 3 else tf.raw_ops.Conv2DBackpropFilter
        grad = backprop(input=inputs, filter_sizes=kernel_shape, out_backprop=d_pre,
                        strides=self._spatial(strides), padding=self.padding.upper())
        return grad[0] if rank == 1 else grad


@keras.saving.register_keras_serializable(package="memgrad")
class Conv1D(SelectiveConv, keras.layers.Conv1D):
    """`keras.layers.Conv1D` that keeps its input only when its kernel is trainable."""


@keras.saving.register_keras_serializable(package="memgrad")
class Conv2D(SelectiveConv, keras.layers.Conv2D):
    """`keras.layers.Conv2D` that keeps its input only when its kernel is trainable.

    Same constructor arguments and weights as ``keras.layers.Conv2D``
    (channels-last, 'valid'/'same' padding, groups=1).

    Example:
      >>> backbone_conv = Conv2D(32, 3, padding="same", activation="relu", trainable=False)
    """


@keras.saving.register_keras_serializable(package="memgrad")
class Conv3D(SelectiveConv, keras.layers.Conv3D):
    """`keras.layers.Conv3D` that keeps its input only when its kernel is trainable."""


@keras.saving.register_keras_serializable(package="memgrad")
class Conv2DTranspose(SelectiveLinear, keras.layers.Conv2DTranspose):
    """`keras.layers.Conv2DTranspose` that keeps its input only when its kernel is trainable.

    Supports channels-last, 'valid'/'same' padding, ``output_padding=None`` and
    no dilation (others are rejected, and `convert` leaves such layers as they are).

    Example:
      >>> up = Conv2DTranspose(16, 3, strides=2, padding="same", trainable=False)
    """

    def _check_supported(self):
        extra = [] if self.output_padding is None else [f"output_padding={self.output_padding!r}"]
        reject_unsupported(self, "output_padding=None", extra)

    # y = conv_transpose(x, K) is the input-gradient of a convolution by K, so its
    # own input gradient is that convolution, and its kernel gradient swaps roles.
    def _input_gradient(self, d_pre, kernel, input_shape):
        return tf.nn.conv2d(d_pre, tf.cast(kernel, d_pre.dtype), strides=[1, *self.strides, 1],
                            padding=self.padding.upper())

    def _kernel_gradient(self, inputs, d_pre, kernel_shape):
        return tf.raw_ops.Conv2DBackpropFilter(
            input=tf.cast(d_pre, inputs.dtype), filter_sizes=kernel_shape, out_backprop=inputs,
            strides=[1, *self.strides, 1], padding=self.padding.upper(),
        )
