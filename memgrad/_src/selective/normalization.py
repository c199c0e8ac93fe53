"""BatchNormalization whose inference-mode backward keeps its input only for a trainable gamma."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.selective.relu import share_kept_input
from memgrad._src.selective.lean_layer import LeanLayer


def _scale_and_offset(layer):
    """A normalisation's trainable weights: ``gamma`` if it scales, ``beta`` if it centres."""
    return ([layer.gamma] if layer.scale else []) + ([layer.beta] if layer.center else [])


@keras.saving.register_keras_serializable(package="memgrad")
class BatchNormalization(LeanLayer, keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` with a lean inference-mode backward.

    In inference mode (``training=False``, or a frozen layer) batch normalisation
    is a per-channel affine map ``y = x * a + c``: the input gradient needs only
    ``a``, and the input is kept only if ``gamma``'s gradient may be requested:
    the layer is trainable, or a tape watched ``gamma`` or ``beta`` before the call
    (how to get a frozen layer's parameter gradients in eager mode; otherwise
    ``tape.gradient`` returns ``None`` for them). TensorFlow's FusedBatchNorm keeps
    the input in every case. Training mode and axes other than the last use
    Keras's computation.

    Example:
      >>> bn = BatchNormalization(trainable=False)   # a frozen backbone's BN keeps nothing
    """

    def call(self, inputs, training=None, mask=None):
        return self.lean_call(inputs, training=training, mask=mask)

    def lean_applies(self, inputs, training=None, mask=None):
        last_axis = self.axis in (-1, inputs.shape.rank - 1, [-1], [inputs.shape.rank - 1])
        return not (training and self.trainable) and last_axis and mask is None

    def lean_weights(self):
        return _scale_and_offset(self)

    def lean_forward(self, inputs, wanted, training=None, mask=None):
        outputs = self.keras_call(inputs, training=False)
        # float64 stays float64; lower precisions compute the backward in float32.
        acc = tf.float64 if inputs.dtype == tf.float64 else tf.float32
        inv_std = tf.math.rsqrt(tf.cast(self.moving_variance.value, acc) + self.epsilon)
        scale = inv_std * (tf.cast(self.gamma.value, acc) if self.scale else 1.0)
        kept_input = inputs if wanted.weights and self.scale else None  # for gamma's gradient
        if kept_input is not None:
            share_kept_input(kept_input)
        mean = tf.cast(self.moving_mean.value, acc) if kept_input is not None else None
        axes = list(range(inputs.shape.rank - 1))
        fused = kept_input is not None and inputs.shape.rank == 4 and inputs.dtype == tf.float32 and self.center

        def fused_backward(d_out):
            # TensorFlow's fused inference-mode gradient: one pass for dx, d_gamma, d_beta.
            dx, d_gamma, d_beta = tf.raw_ops.FusedBatchNormGradV3(
                y_backprop=d_out, x=kept_input, scale=tf.cast(self.gamma.value, tf.float32),
                reserve_space_1=mean, reserve_space_2=tf.cast(self.moving_variance.value, tf.float32),
                reserve_space_3=tf.constant([], tf.float32), epsilon=self.epsilon, is_training=False,
            )[:3]
            return [dx if wanted.inputs else None, d_gamma, d_beta]

        def backward(d_out):
            if fused:
                return fused_backward(d_out)
            d32 = tf.cast(d_out, acc)
            grads = [tf.cast(d32 * scale, d_out.dtype) if wanted.inputs else None]
            if wanted.weights:
                if self.scale:
                    normalized = (tf.cast(kept_input, acc) - mean) * inv_std
                    grads.append(tf.cast(tf.reduce_sum(d32 * normalized, axis=axes), self.gamma.dtype))
                if self.center:
                    grads.append(tf.cast(tf.reduce_sum(d32, axis=axes), self.beta.dtype))
            return grads

        return outputs, backward


@keras.saving.register_keras_serializable(package="memgrad")
class LayerNormalization(LeanLayer, keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` whose backward keeps only its input.

    TensorFlow's tape keeps about six tensors of the input's size for Keras's layer
    normalisation (measured: 25 MiB for a 4 MiB input); the gradient needs the input
    and two small per-row statistics. A frozen layer on unwatched inputs keeps nothing.
    ``rms_scaling=True`` runs Keras's computation.

    Example:
      >>> norm = LayerNormalization(epsilon=1e-12)
    """

    def call(self, inputs):
        return self.lean_call(inputs)

    def lean_applies(self, inputs):
        return not self.rms_scaling

    def lean_weights(self):
        return _scale_and_offset(self)

    def lean_backward(self, inputs, outputs, wanted):
        rank = inputs.shape.rank
        axes = sorted(a % rank for a in (self.axis if isinstance(self.axis, (list, tuple)) else [self.axis]))
        other_axes = [a for a in range(rank) if a not in axes]
        acc = tf.float64 if inputs.dtype == tf.float64 else tf.float32
        mean, variance = tf.nn.moments(tf.cast(inputs, acc), axes, keepdims=True)
        inv_std = tf.math.rsqrt(variance + self.epsilon)
        gamma = tf.cast(self.gamma.value, acc) if self.scale else None
        share_kept_input(inputs)  # kept: the normalised input is recomputed from it
        broadcast = [inputs.shape[a] if a in axes else 1 for a in range(rank)]

        def backward(d_out):
            d = tf.cast(d_out, acc)
            normalized = (tf.cast(inputs, acc) - mean) * inv_std
            d_normalized = d * tf.reshape(gamma, broadcast) if gamma is not None else d
            grads = [None]
            if wanted.inputs:
                dx = inv_std * (d_normalized - tf.reduce_mean(d_normalized, axes, keepdims=True)
                                - normalized * tf.reduce_mean(d_normalized * normalized, axes, keepdims=True))
                grads = [tf.cast(dx, d_out.dtype)]
            if wanted.weights:
                if self.scale:
                    grads.append(tf.cast(tf.reshape(tf.reduce_sum(d * normalized, other_axes), self.gamma.shape),
                                         self.gamma.dtype))
                if self.center:
                    grads.append(tf.cast(tf.reshape(tf.reduce_sum(d, other_axes), self.beta.shape), self.beta.dtype))
            return grads

        return backward
