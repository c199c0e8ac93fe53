"""Small reversible stacks shared by the tests, and their plain-autodiff twins."""

import keras
import numpy as np
import tensorflow as tf

from memgrad.layers import (
    ActNorm,
    AdditiveCoupling,
    AffineCoupling,
    ChannelPermutation,
    Invertible1x1Conv,
    ReversibleSequence,
    Squeeze,
)


def dense(units, seed, activation="tanh", dtype=None, stddev=0.3):
    return keras.layers.Dense(
        units, activation=activation, dtype=dtype,
        kernel_initializer=keras.initializers.RandomNormal(stddev=stddev, seed=seed),
        bias_initializer=keras.initializers.RandomNormal(stddev=0.1, seed=seed + 1000),
    )


def conv(channels, seed, dtype=None):
    return keras.layers.Conv2D(
        channels, 3, padding="same", activation="tanh", dtype=dtype,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.2, seed=seed),
    )


def make_blocks(kind, depth, channels, dtype=None, scale="exp"):
    """Blocks of one kind for a [batch, channels] (or image, for 'image', 'conv_additive' and
    'image_flow') input; ``scale`` is the affine couplings' of 'image_flow'."""
    half = channels // 2
    blocks = []
    for i in range(depth):
        s = 10 * i
        if kind == "additive":
            blocks.append(AdditiveCoupling(dense(half, s, dtype=dtype), dense(half, s + 1, dtype=dtype), dtype=dtype))
        elif kind == "affine":
            blocks.append(AffineCoupling(dense(half, s, dtype=dtype), dense(half, s + 1, None, dtype=dtype), dtype=dtype))
        elif kind == "affine_sigmoid_network":
            blocks.append(AffineCoupling(network=dense(channels, s, None, dtype=dtype), scale="sigmoid", dtype=dtype))
        elif kind == "algorithm1":
            blocks.append(AffineCoupling(dense(half, s, dtype=dtype), dense(half, s + 1, None, dtype=dtype),
                                         fused_backward=False, dtype=dtype))
        elif kind == "flow":
            blocks += [ActNorm(dtype=dtype), Invertible1x1Conv(seed=i, dtype=dtype),
                       AffineCoupling(dense(half, s, dtype=dtype), dense(half, s + 1, None, dtype=dtype),
                                      scale="sigmoid", dtype=dtype),
                       ChannelPermutation(dtype=dtype)]
        elif kind == "conv_additive":
            blocks.append(AdditiveCoupling(conv(half, s, dtype), conv(half, s + 1, dtype), dtype=dtype))
        elif kind == "image_flow":  # one Glow step: ActNorm, 1x1 convolution, affine coupling
            blocks += [ActNorm(dtype=dtype), Invertible1x1Conv(seed=i, dtype=dtype),
                       AffineCoupling(conv(half, s, dtype), conv(half, s + 1, dtype), scale=scale, dtype=dtype)]
        elif kind == "image":
            blocks += [AdditiveCoupling(conv(half, s, dtype), conv(half, s + 1, dtype), dtype=dtype)]
            if i == depth // 2:
                blocks.append(Squeeze(dtype=dtype))
                channels, half = channels * 4, half * 4
        else:
            raise ValueError(kind)
    return blocks


def plain_forward(blocks, x, training=None, dtype=None):
    """The same computation as the stack, differentiated by plain autodiff.

    ``dtype``: the dtype the blocks' activations are carried in (a stack's
    ``invertible_dtype``); default ``x``'s.
    """
    h = x if dtype is None else tf.cast(x, dtype)
    logdet = tf.zeros(tf.shape(x)[:1], h.dtype)
    for block in blocks:
        h, block_logdet = block.forward(h, training=training)
        logdet = logdet + tf.cast(block_logdet, h.dtype)
    return tf.cast(h, x.dtype), tf.cast(logdet, x.dtype)


def loss_of(y, logdet):
    """A loss that gives every output element and the log-det distinct gradients."""
    weights = tf.cast(tf.reshape(tf.range(tf.size(y[0])) % 7, y.shape[1:]), y.dtype) / 7.0
    return tf.reduce_sum(tf.sin(y) * weights) + 0.3 * tf.reduce_sum(logdet)


def gradients(forward, x, variables):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y, logdet = forward(x)
        loss = loss_of(y, logdet)
    return tape.gradient(loss, [x] + list(variables))


def max_relative_error(got, want):
    return max(
        float(np.max(np.abs(g - w)) / (np.max(np.abs(w)) + 1e-300))
        for g, w in zip(got, want)
    )


def angle_degrees(got, want):
    g = np.concatenate([np.ravel(t) for t in got]).astype(np.float64)
    w = np.concatenate([np.ravel(t) for t in want]).astype(np.float64)
    cosine = np.dot(g, w) / (np.linalg.norm(g) * np.linalg.norm(w))
    return float(np.degrees(np.arccos(np.clip(cosine, -1.0, 1.0))))


def built_stack(kind, depth, input_shape, dtype=None, **kwargs):
    stack = ReversibleSequence(make_blocks(kind, depth, input_shape[-1], dtype), return_logdet=True,
                               dtype=dtype, **kwargs)
    stack.build((None,) + tuple(input_shape))
    return stack
