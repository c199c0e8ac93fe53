"""Memory and time of a gradient of a gradient, memgrad vs plain: a WGAN-GP critic step and a
Hessian-vector product through a two-layer LSTM.

- ``wgan``: a critic (residual blocks Dense(width, tanh) -> Dense(width), a linear head)
  trained on its score plus 10x the gradient penalty (||d critic(x) / d x|| - 1)^2.
- ``lstm``: H v for the weights of two Keras LSTM layers (and a Dense head) over T steps:
  the gradient of <d loss / d w, v>.

Each takes an inner gradient (``d critic / d x``, ``d loss / d w``) and an outer one of a
function of it. A variant names who computes each: TensorFlow (``plain``) or memgrad with a
strategy. ``--entry tape`` nests `tf.GradientTape` / `memgrad.GradientTape`; ``--entry
gradients`` calls `tf.gradients` / `memgrad.gradients` twice. Every variant's peak above the
weights and its time are the median of ``--repeats`` calls (memgrad.profiler.measure_runs),
with the largest relative gradient error against plain's and what became of memgrad's calls:
rewritten, planned as plain backprop (the strategy found nothing worth recomputing), or fallen
back with a warning (the rewrite cannot handle the graph).

    python scripts/higher_order.py                         # both workloads, both entries
    python scripts/higher_order.py --workload wgan --entry tape --blocks 32
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # exact CPU memory figures

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import memgrad  # noqa: E402

# name: (inner gradient, outer gradient); "plain" is TensorFlow's own.
VARIANTS = {
    "plain": ("plain", "plain"),
    "memory inner, plain outer": ("memory", "plain"),
    "memory": ("memory", "memory"),
    "speed": ("speed", "speed"),
}


def critic(blocks, width, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((width,))
    h = inputs
    for _ in range(blocks):
        h = h + keras.layers.Dense(width)(keras.layers.Dense(width, activation="tanh")(h))
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def lstm(units, steps, seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((steps, units))
    h = keras.layers.LSTM(units, return_sequences=True)(inputs)
    h = keras.layers.LSTM(units, return_sequences=True)(h)
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def _differentiate(entry, strategy):
    """(context, gradient) for one order: a tape (``with context as t``, then
    ``gradient(t, y, xs)``) or a direct call (the context is a null one)."""
    if entry == "tape":
        make = tf.GradientTape if strategy == "plain" else (
            lambda: memgrad.GradientTape(checkpoints=strategy))
        return make, lambda tape, y, xs: tape.gradient(y, xs)
    if strategy == "plain":
        return contextlib.nullcontext, lambda _, y, xs: tf.gradients(y, xs)
    return contextlib.nullcontext, (
        lambda _, y, xs: memgrad.gradients(y, xs, checkpoints=strategy))


def penalty_gradients(model, entry, inner, outer):
    """A tf.function: the critic loss's gradients (score + 10x the gradient penalty)."""
    weights = model.trainable_variables
    (inner_context, inner_grad), (outer_context, outer_grad) = (
        _differentiate(entry, inner), _differentiate(entry, outer))

    @tf.function
    def step(x):
        with outer_context() as outer_tape:
            if outer_tape is not None:
                outer_tape.watch(x)
            with inner_context() as inner_tape:
                if inner_tape is not None:
                    inner_tape.watch(x)
                score = tf.reduce_sum(model(x))
            slope = tf.norm(inner_grad(inner_tape, score, [x])[0], axis=1)
            loss = (score / tf.cast(tf.shape(x)[0], score.dtype)
                    + 10.0 * tf.reduce_mean(tf.square(slope - 1.0)))
        return outer_grad(outer_tape, loss, weights)

    return step


def hessian_vector_product(model, entry, inner, outer):
    """A tf.function: H v for the model's weights, v a fixed random direction."""
    weights = model.trainable_variables
    v = [tf.random.stateless_normal(w.shape, [1, i]) for i, w in enumerate(weights)]
    (inner_context, inner_grad), (outer_context, outer_grad) = (
        _differentiate(entry, inner), _differentiate(entry, outer))

    @tf.function
    def step(x):
        with outer_context() as outer_tape:
            with inner_context() as inner_tape:
                loss = tf.reduce_mean(model(x) ** 2)
            grads = inner_grad(inner_tape, loss, weights)
            along = tf.add_n([tf.reduce_sum(g * d) for g, d in zip(grads, v)])
        return outer_grad(outer_tape, along, weights)

    return step


def workload(name, args):
    """(title, make_step(entry, inner, outer), x)."""
    if name == "wgan":
        model = critic(args.blocks, args.width)
        return (f"WGAN-GP critic, {args.blocks} residual blocks, width {args.width}, "
                f"batch {args.batch}",
                lambda *variant: penalty_gradients(model, *variant),
                tf.random.stateless_normal([args.batch, args.width], seed=[0, 1]))
    model = lstm(args.units, args.steps)
    return (f"Hessian-vector product, 2-layer Keras LSTM ({args.units} units), "
            f"T={args.steps}, batch {args.sequences}",
            lambda *variant: hessian_vector_product(model, *variant),
            tf.random.stateless_normal([args.sequences, args.steps, args.units], seed=[0, 1]))


def measure(title, make_step, x, entry, repeats):
    """Prints one markdown table: every variant against plain."""
    results = variant_results(make_step, x, entry, repeats)
    plain_peak, plain_ms = results["plain"][:2]
    print(f"\n{title}; entry: {entry} (median of {repeats} calls)")
    print("| variant (inner, outer) | peak MiB | peak vs plain | ms/step | time vs plain "
          "| gradient error vs plain | memgrad calls: rewritten / plain plan / fell back |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, (peak, ms, error, fell) in results.items():
        print(f"| {name} | {peak:.1f} | {peak / plain_peak:.2f}x | {ms:.1f} | "
              f"{ms / plain_ms:.2f}x | {error:.1e} | {fell} |", flush=True)


def variant_results(make_step, x, entry, repeats):
    """{variant: (median peak above the weights in MiB, median ms per call, largest relative
    gradient error vs plain, memgrad's calls "rewritten / plain plan / fell back" or "-")}."""
    results, reference = {}, None
    for name, (inner, outer) in VARIANTS.items():
        step = make_step(entry, inner, outer)
        with warnings.catch_warnings(), memgrad.record_rewrites() as log:
            warnings.simplefilter("ignore")  # a fallback is reported in the table
            grads = step(x)
        if reference is None:
            reference = grads
        error = max(float(tf.reduce_max(tf.abs(g - r)) / max(float(tf.reduce_max(tf.abs(r))), 1e-30))
                    for g, r in zip(grads, reference))
        warned = sum(1 for e in log if e.fallback_reason)
        planned_plain = sum(1 for e in log if e.fallback and not e.fallback_reason)
        calls = f"{len(log) - warned - planned_plain} / {planned_plain} / {warned}"
        runs = memgrad.profiler.measure_runs(step, (x,), device="CPU:0", warmup=1, repeats=repeats)
        results[name] = (statistics.median(r.peak_above_baseline_bytes for r in runs) / 2**20,
                         statistics.median(r.wall_time_s for r in runs) * 1e3, error,
                         calls if log else "-")
    return results


def parse_args(argv=None):
    """The command's arguments (``parse_args([])``: the default workloads' sizes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["wgan", "lstm", "all"], default="all")
    parser.add_argument("--entry", choices=["tape", "gradients", "all"], default="all")
    parser.add_argument("--blocks", type=int, default=16, help="wgan: residual blocks")
    parser.add_argument("--width", type=int, default=256, help="wgan: block width")
    parser.add_argument("--batch", type=int, default=512, help="wgan: batch")
    parser.add_argument("--units", type=int, default=64, help="lstm: units per layer")
    parser.add_argument("--steps", type=int, default=256, help="lstm: time steps T")
    parser.add_argument("--sequences", type=int, default=16, help="lstm: batch")
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    workloads = ["wgan", "lstm"] if args.workload == "all" else [args.workload]
    entries = ["tape", "gradients"] if args.entry == "all" else [args.entry]
    for name in workloads:
        title, make_step, x = workload(name, args)
        for entry in entries:
            measure(title, make_step, x, entry, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
