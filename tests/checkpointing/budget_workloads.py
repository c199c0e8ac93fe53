"""Workloads for the budget planner's tests: chains, residual nets, dense blocks, U-Net skips
and a chain of uneven widths; each returns (weights, loss_fn, input shape)."""

import math

import numpy as np
import tensorflow as tf

from memgrad.profiler.workloads import UNEVEN_WIDTHS, residual_chain, uneven_chain


def _var(rng, *shape):
    return tf.Variable((rng.standard_normal(shape) / np.sqrt(shape[0])).astype("float32"))


def residual(depth=64, width=128, batch=4096):
    weights, loss_fn = residual_chain(depth, width, seed=depth)
    return weights, loss_fn, [batch, width]


def tanh_chain(depth=48, width=256, batch=2048):
    rng = np.random.default_rng(1)
    weights = [_var(rng, width, width) for _ in range(depth)]

    def loss_fn(x):
        h = x
        for w in weights:
            h = tf.tanh(h @ w)
        return tf.reduce_mean(h * h)

    return weights, loss_fn, [batch, width]


def dense_blocks(batch=4096):
    """Four densely connected blocks of eight layers: no single-tensor separator inside.

    Also the DenseNet-style workload of test_memory.py."""
    rng = np.random.default_rng(5)
    blocks = [[_var(rng, 32 + 32 * i, 32) for i in range(8)] for _ in range(4)]
    transitions = [_var(rng, 32 * 9, 32) for _ in range(4)]

    def loss_fn(x):
        h = x
        for block, transition in zip(blocks, transitions):
            features = [h]
            for w in block:
                features.append(tf.nn.relu(tf.concat(features, -1) @ w))
            h = tf.concat(features, -1) @ transition
        return tf.reduce_mean(h * h)

    return [w for b in blocks for w in b] + transitions, loss_fn, [batch, 32]


def uneven(batch=2048):
    """A ReLU chain whose layer widths vary 16-fold: equal spacing keeps the wrong layers."""
    weights, loss_fn = uneven_chain()
    return weights, loss_fn, [batch, UNEVEN_WIDTHS[-1]]


WORKLOADS = {"residual": residual, "tanh_chain": tanh_chain, "dense_blocks": dense_blocks,
             "uneven": uneven}
# The op type whose outputs are the layers' outputs: sqrt(n) spacing keeps every k-th one.
LAYER_OUTPUT = {"residual": "AddV2", "tanh_chain": "Tanh", "dense_blocks": "Relu",
                "uneven": "Relu"}


def sqrt_spacing(model, layer_type):
    """Cuts after every k-th layer, k = round(sqrt(layers)): the tensors alive there."""
    ends = [p for p, op in enumerate(model.profile.ops) if op.type == layer_type]
    k = max(1, round(math.sqrt(len(ends))))
    return model.tensors_for(ends[k - 1:-1:k])
