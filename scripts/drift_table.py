"""Measures how far reversible gradients drift from plain autodiff, for each way to bound it.

For random-init stacks (batch 2, 8x8x8 features, 3x3 convolutions, as in
tests/reversible/test_drift.py) it prints, per configuration, the global relative gradient
error ``||g_rev - g_plain|| / ||g_plain||`` over the input's and every weight's gradient, where
``g_plain`` is plain autodiff (tf.GradientTape) of the same forward computation, and the
largest such error of a single gradient tensor, and the relative error of
``stack.inverse(stack(x))``. Configurations:

- ``float32``: activations carried and couplings computed in float32 (memgrad before `invertible_dtype` existed);
- ``float64``: ``invertible_dtype="float64"`` (the default under a float32 policy);
- ``anchor k``: float32, with an exact activation kept every k blocks (k-block stacks in a row);
- ``sigmoid``: affine couplings with Glow's bounded scale instead of ``exp``, float32.

Run: ``PYTHONPATH=. python scripts/drift_table.py`` (about two minutes on 2 cores).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from memgrad.layers import ReversibleSequence  # noqa: E402
from tests.reversible.stacks import gradients, make_blocks, plain_forward  # noqa: E402

SHAPE = (8, 8, 8)


def worst_tensor_error(got, want):
    """The largest ``||g - w|| / ||w||`` of a single gradient tensor."""
    return max(float(np.linalg.norm(np.ravel(g).astype(np.float64) - np.ravel(w))
                     / np.linalg.norm(np.ravel(w).astype(np.float64)))
               for g, w in zip(got, want))


def global_relative_error(got, want):
    g = np.concatenate([np.ravel(t) for t in got]).astype(np.float64)
    w = np.concatenate([np.ravel(t) for t in want]).astype(np.float64)
    return float(np.linalg.norm(g - w) / np.linalg.norm(w))


def measure(kind, depth, invertible_dtype, anchor_every=None, scale="exp"):
    x = tf.random.stateless_normal((2,) + SHAPE, seed=[5, 6])
    blocks = make_blocks(kind, depth, SHAPE[-1], scale=scale)
    every = anchor_every or len(blocks)
    stacks = [ReversibleSequence(blocks[i:i + every], return_logdet=True, invertible_dtype=invertible_dtype)
              for i in range(0, len(blocks), every)]

    def reversible(t):
        logdet = 0.0
        for stack in stacks:
            t, block_logdet = stack(t)
            logdet += block_logdet
        return t, logdet

    reversible(x)  # builds; ActNorm initialises from this batch
    carry = stacks[0].invertible_dtype
    variables = [v for stack in stacks for v in stack.trainable_variables]
    got = tf.function(lambda t: gradients(reversible, t, variables))(x)
    want = tf.function(lambda t: gradients(lambda u: plain_forward(blocks, u, dtype=carry), t, variables))(x)
    y = reversible(x)[0]
    for stack in reversed(stacks):
        y = stack.inverse(y)
    inverse_error = float(tf.reduce_max(tf.abs(y - x)) / tf.reduce_max(tf.abs(x)))
    got, want = [g.numpy() for g in got], [w.numpy() for w in want]
    return global_relative_error(got, want), worst_tensor_error(got, want), inverse_error


def main():
    rows = [
        ("conv_additive", 64, "float32", None, "exp"),
        ("conv_additive", 64, "float32", 16, "exp"),
        ("conv_additive", 64, "float32", 8, "exp"),
        ("conv_additive", 64, "float64", None, "exp"),
        ("image_flow", 16, "float32", None, "exp"),
        ("image_flow", 16, "float32", 16, "exp"),
        ("image_flow", 16, "float32", None, "sigmoid"),
        ("image_flow", 16, "float64", None, "exp"),
    ]
    print("| stack | carried in | anchors | scale | gradient error | worst tensor | inverse error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for kind, depth, dtype, every, scale in rows:
        error, worst, inverse_error = measure(kind, depth, dtype, every, scale)
        name = f"{depth} additive blocks" if kind == "conv_additive" else f"{depth} flow steps"
        anchors = f"every {every} blocks" if every else "none"
        print(f"| {name} | {dtype} | {anchors} | {scale if kind != 'conv_additive' else '-'} | "
              f"{error:.1e} | {worst:.1e} | {inverse_error:.1e} |", flush=True)


if __name__ == "__main__":
    main()
