"""Memory and time of a gradient of a gradient: a WGAN-GP critic step, memgrad vs plain.

The critic (residual blocks Dense(width, tanh) -> Dense(width), a linear head) is trained on
its score plus 10x the gradient penalty (||d critic(x) / d x|| - 1)^2: an outer
tf.GradientTape differentiates the inner tape's gradient. The inner tape is tf.GradientTape
(plain) or memgrad.GradientTape with each strategy; every variant's peak above the weights and
its time are the median of `--repeats` calls (memgrad.profiler.measure_runs), with the
largest gradient error against plain's.

    python scripts/higher_order.py                   # 16 blocks, width 256, batch 512
    python scripts/higher_order.py --blocks 32 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # exact CPU memory figures

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import memgrad  # noqa: E402

VARIANTS = ("plain", "memory", "speed")


def critic(blocks, width, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((width,))
    h = inputs
    for _ in range(blocks):
        h = h + keras.layers.Dense(width)(keras.layers.Dense(width, activation="tanh")(h))
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def penalty_gradients(model, variant):
    """A tf.function: the critic loss's gradients (score + 10x the gradient penalty)."""
    weights = model.trainable_variables

    def inner_tape():
        return tf.GradientTape() if variant == "plain" else memgrad.GradientTape(checkpoints=variant)

    @tf.function
    def grads_of(x):
        with tf.GradientTape() as outer:
            with inner_tape() as inner:
                inner.watch(x)
                score = tf.reduce_sum(model(x))
            slope = tf.norm(inner.gradient(score, x), axis=1)
            loss = score / tf.cast(tf.shape(x)[0], score.dtype) + 10.0 * tf.reduce_mean(tf.square(slope - 1.0))
        return outer.gradient(loss, weights)

    return grads_of


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    model = critic(args.blocks, args.width)
    x = tf.random.stateless_normal([args.batch, args.width], seed=[0, 1])
    results, reference = {}, None
    for variant in VARIANTS:
        step = penalty_gradients(model, variant)
        grads = step(x)
        if reference is None:
            reference = grads
        error = max(float(tf.reduce_max(tf.abs(g - r)) / max(float(tf.reduce_max(tf.abs(r))), 1e-30))
                    for g, r in zip(grads, reference))
        runs = memgrad.profiler.measure_runs(step, (x,), device="CPU:0", warmup=1, repeats=args.repeats)
        results[variant] = (statistics.median(r.peak_above_baseline_bytes for r in runs) / 2**20,
                            statistics.median(r.wall_time_s for r in runs) * 1e3, error)
    plain_peak, plain_ms, _ = results["plain"]
    print(f"WGAN-GP critic, {args.blocks} residual blocks, width {args.width}, batch {args.batch} "
          f"(median of {args.repeats} calls)")
    print("| variant | peak MiB | peak vs plain | ms/step | time vs plain | gradient error vs plain |")
    print("| --- | --- | --- | --- | --- | --- |")
    for variant, (peak, ms, error) in results.items():
        print(f"| {variant} | {peak:.1f} | {peak / plain_peak:.2f}x | {ms:.1f} | {ms / plain_ms:.2f}x | {error:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
