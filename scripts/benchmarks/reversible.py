"""Reversible stacks against plain backprop of the same blocks: time and peak."""

from __future__ import annotations

import tensorflow as tf

import memgrad
from memgrad.layers import AdditiveCoupling, AffineCoupling, ReversibleSequence

from benchmarks.common import conv_net, ratio_row, time_side_by_side, training_step


def reversible_suite(rounds, batch=32, size=16, channels=64, depth=8):
    """Reversible stacks vs plain backprop of the same blocks (time and peak memory)."""
    half = channels // 2
    x = tf.random.stateless_normal([batch, size, size, channels], seed=[0, 1])
    variants = {
        "additive coupling (RevNet)": lambda i: AdditiveCoupling(conv_net(half, 4 * i), conv_net(half, 4 * i + 2)),
        "affine coupling, fused backward (Algorithm 2)": lambda i: AffineCoupling(
            conv_net(half, 4 * i), conv_net(half, 4 * i + 2), scale="sigmoid"),
        "affine coupling, invert then recompute (Algorithm 1)": lambda i: AffineCoupling(
            conv_net(half, 4 * i), conv_net(half, 4 * i + 2), scale="sigmoid", fused_backward=False),
    }
    targets = {"additive coupling (RevNet)": 1.35, "affine coupling, fused backward (Algorithm 2)": 1.4,
               "affine coupling, invert then recompute (Algorithm 1)": 2.3}
    rows = []
    for name, make_block in variants.items():
        stack = ReversibleSequence([make_block(i) for i in range(depth)])
        stack.build(x.shape)

        def plain(t, blocks=stack.blocks):
            for block in blocks:
                t, _ = block.forward(t)
            return t

        steps = {"memgrad": training_step(stack, stack.trainable_variables),
                 "plain": training_step(plain, stack.trainable_variables)}
        seconds = time_side_by_side(steps, x, rounds)
        peaks = {key: memgrad.profiler.measure(step, args=(x,)).peak_above_baseline_bytes for key, step in steps.items()}
        rows.append(ratio_row("reversible", f"{name}, {depth} blocks, batch {batch}x{size}x{size}x{channels}",
                              targets[name], seconds, peaks))
    return rows
