"""memgrad's main claims checked on a GPU: one command, a table beside the CPU figures.

    python scripts/gpu_check.py                   # on GPU:0
    python scripts/gpu_check.py --device CPU:0    # the same checks on the CPU (3 min on 2 cores)
    python scripts/gpu_check.py --check lstm      # one check (repeatable)

Without a GPU (and without ``--device``) it says so in one line and exits 0. Each check
measures on the device what a GPU user relies on most:

- ``profiler``: the peak `memgrad.profiler.measure` reads on the device's allocator for a
  buffer of known size, and `memory_by_category`'s split of a Keras training step (the
  categories sum to the peak, the weights are the model's).
- ``gpt2``: keras-hub's GPT2Backbone (6x384, random init, batch 8x128 tokens) compiled with
  XLA (``jit_compile=True``, Keras's default for ``fit`` on a GPU): plain backprop,
  ``checkpoints='memory'`` and ``Budget(0.5, hold_gradients=False)``.
- ``reversible``: an additive `ReversibleSequence` at 8 and 64 blocks, eager and in a
  ``tf.function``: its peak without the weights' gradients (frozen, the gradient with respect
  to its input) does not grow with depth; a training step's peaks are shown beside it.
- ``lstm``: a 2-layer Keras LSTM (128 units) over 512 steps, plain against
  ``memgrad.GradientTape('memory')``. On a GPU, Keras runs the LSTM as one cuDNN op, not a
  `tf.while_loop`, so memgrad has no loop to segment there: this check says what holds.

Every figure is a median over three measured calls after a warm-up. The CPU column holds
this script's own figures on a 2-core CPU (``--device CPU:0``, oneDNN on, TensorFlow 2.21).
The exit status is 1 when a claim is missed on the device, else 0. Timing ratios are shown,
not checked (another job on the machine moves them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MiB = 2**20
# This script's figures with --device CPU:0 on a 2-core CPU (oneDNN on, TensorFlow 2.21, beside
# another job on the same cores: the time ratios move with it, the peaks little).
CPU_FIGURES = {
    "profiler/known buffer": "64.0 MiB read for 64.0 MiB",
    "profiler/categories": "sum 24.0 of 24.0 MiB, weights 6.01 of 6.01 MiB",
    "gpt2/memory": "0.33x (86.8 of 266.0 MiB), time 1.01x",
    "gpt2/budget": "0.94x of its budget (149.9 of 159.8 MiB), time 0.98x",
    "reversible/eager": "1.00x (27.1 -> 27.1 MiB; allocator 31.9 -> 35.5 MiB; training step 36.4 -> 49.7 MiB)",
    "reversible/graph": "1.00x (18.0 -> 18.0 MiB; allocator 19.8 -> 21.7 MiB; training step 23.1 -> 21.8 MiB)",
    "lstm/memory": "0.27x (21.3 of 78.5 MiB), time 2.02x, 2 of 2 loops segmented",
}
CHECKS = ("profiler", "gpt2", "reversible", "lstm")


def _median_peak_and_time(step, args, device, repeats=3):
    import memgrad

    runs = memgrad.profiler.measure_runs(step, args, device=device, warmup=1, repeats=repeats)
    return (statistics.median(r.peak_above_baseline_bytes for r in runs),
            statistics.median(r.wall_time_s for r in runs))


def _row(check, claim, measured, met, note=""):
    return {"check": check, "claim": claim, "measured": measured, "met": met, "note": note}


def check_profiler(device):
    """The allocator's peak for a known buffer; the categories of a Keras step's peak."""
    import keras
    import tensorflow as tf

    import memgrad

    elements = 16 * MiB  # float32: 64 MiB

    @tf.function
    def known(x):
        return tf.reduce_sum(tf.fill([elements], x))

    peak, _ = _median_peak_and_time(known, (tf.constant(1.0),), device)
    rows = [_row("profiler/known buffer", "a 64 MiB buffer reads 64-67.2 MiB",
                 f"{peak / MiB:.1f} MiB read for 64.0 MiB", 64 * MiB <= peak <= 1.05 * 64 * MiB)]
    with tf.device(device):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
        x = tf.random.stateless_normal([1024, 512], seed=[0, 1])

    @tf.function
    def step(t):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(t, training=True)))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    split = memgrad.profiler.memory_by_category(step, x, weights=model.weights,
                                                optimizer_variables=optimizer.variables, device=device)
    parts = (split.weights + split.optimizer + split.inputs_and_other + split.activations
             + split.gradients + split.temporaries)
    weights = sum(v.numpy().nbytes for v in model.weights)
    rows.append(_row("profiler/categories", "categories sum to the peak; weights = the model's",
                     f"sum {parts / MiB:.1f} of {split.peak_bytes / MiB:.1f} MiB, weights "
                     f"{split.weights / MiB:.2f} of {weights / MiB:.2f} MiB, activations "
                     f"{split.activations / MiB:.1f} MiB",
                     parts == split.peak_bytes and split.weights == weights and split.activations > 0))
    return rows


def _sgd_step(model, loss_of, tape_factory, jit_compile=None):
    import tensorflow as tf

    variables = model.trainable_variables

    def step(inputs):
        with tape_factory() as tape:
            loss = loss_of(inputs)
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(1e-4 * tf.convert_to_tensor(grad))  # embeddings: IndexedSlices
        return loss

    return tf.function(step, jit_compile=jit_compile) if jit_compile is not None else step


def check_gpt2(device):
    """GPT-2 under XLA: 'memory' against plain, a Budget against its budget."""
    import functools

    import first_call  # the same GPT-2 and batch as its first-call table
    import tensorflow as tf

    import memgrad

    try:
        with tf.device(device):
            model, inputs = first_call.model_and_batch("gpt2")
    except ImportError:
        return [_row("gpt2/memory", "'memory' <= 0.50x plain's peak", "skipped: keras-hub is not "
                     "installed (pip install -e '.[test]')", None)]

    def loss_of(t):
        return tf.reduce_mean(tf.square(model(t, training=True)))

    budget = memgrad.strategies.Budget(0.5, hold_gradients=False)
    variants = {"plain": tf.GradientTape,
                "memory": functools.partial(memgrad.GradientTape, checkpoints="memory"),
                "budget": functools.partial(memgrad.GradientTape, checkpoints=budget)}
    figures = {}
    for name, tape in variants.items():
        step = _sgd_step(model, loss_of, tape, jit_compile=True)
        with memgrad.record_rewrites() as log:
            with tf.device(device):
                step(inputs)
        plans = [r.plan for r in log if r.plan is not None and r.mode == "budget"]
        figures[name] = _median_peak_and_time(step, (inputs,), device) + (
            plans[0].details["budget_bytes"] if plans else None,)
    plain_peak, plain_time, _ = figures["plain"]
    peak, seconds, _ = figures["memory"]
    rows = [_row("gpt2/memory", "'memory' <= 0.50x plain's peak (XLA)",
                 f"{peak / plain_peak:.2f}x ({peak / MiB:.1f} of {plain_peak / MiB:.1f} MiB)",
                 peak <= 0.5 * plain_peak, f"time {seconds / plain_time:.2f}x plain's")]
    peak, seconds, budget_bytes = figures["budget"]
    rows.append(_row("gpt2/budget", "Budget(0.5, hold_gradients=False) <= 1.05x its budget (XLA)",
                     f"{peak / budget_bytes:.2f}x of its budget ({peak / MiB:.1f} of "
                     f"{budget_bytes / MiB:.1f} MiB)", peak <= 1.05 * budget_bytes,
                     f"time {seconds / plain_time:.2f}x plain's"))
    return rows


def _reversible_stack(depth, batch=4096, width=128):
    import keras
    import tensorflow as tf

    from memgrad.layers import AdditiveCoupling, ReversibleSequence

    def net():
        return keras.Sequential([keras.layers.Dense(2 * width, activation="relu"),
                                 keras.layers.Dense(width // 2, activation="tanh")])

    keras.utils.set_random_seed(depth)
    stack = ReversibleSequence([AdditiveCoupling(net(), net()) for _ in range(depth)])
    stack.build((None, width))
    return stack, tf.random.stateless_normal([batch, width], seed=[0, 1])


def check_reversible(device, depths=(8, 64)):
    """An additive stack at 64 blocks against 8: the peak of its gradient with respect to the
    input, weights frozen (activations and their gradients, no weights' gradients) must not
    grow; a training step's peak adds the weights' gradients alive then, which must grow."""
    import tensorflow as tf

    def input_gradient(stack):
        stack.trainable = False  # else a custom gradient computes the weights' gradients eagerly

        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_mean(tf.square(stack(x)))
            return tape.gradient(loss, x)
        return step

    import memgrad

    rows = []
    for graph in (False, True):
        peaks, requested, training = {}, {}, {}
        for depth in depths:
            with tf.device(device):
                stack, x = _reversible_stack(depth)
            sgd = _sgd_step(stack, lambda t, stack=stack: tf.reduce_mean(tf.square(stack(t))),
                            tf.GradientTape, jit_compile=False if graph else None)
            training[depth], _ = _median_peak_and_time(sgd, (x,), device)
            step = tf.function(input_gradient(stack)) if graph else input_gradient(stack)
            peaks[depth], _ = _median_peak_and_time(step, (x,), device)
            # The bytes requested at the peak: the allocator's fitting left out, which depends on
            # what earlier steps left free (BFC hands out a free chunk under twice a request whole).
            requested[depth] = memgrad.profiler.largest_live_tensors(
                step, args=(x,), k=1, device=device).requested_peak_bytes
        shallow, deep = depths
        growth = requested[deep] / requested[shallow]
        rows.append(_row(f"reversible/{'graph' if graph else 'eager'}",
                         f"{deep} blocks' peak without the weights' gradients <= 1.05x "
                         f"{shallow} blocks' ({'tf.function' if graph else 'eager'}; bytes requested)",
                         f"{growth:.2f}x ({requested[shallow] / MiB:.1f} -> {requested[deep] / MiB:.1f} MiB; "
                         f"allocator {peaks[shallow] / MiB:.1f} -> {peaks[deep] / MiB:.1f} MiB; "
                         f"training step {training[shallow] / MiB:.1f} -> {training[deep] / MiB:.1f} MiB)",
                         growth <= 1.05))
    return rows


def check_lstm(device):
    """A 2-layer Keras LSTM over 512 steps: memgrad's tape against plain backprop."""
    import functools

    import tensorflow as tf

    import memgrad
    from memgrad.profiler.workloads import lstm_regressor

    with tf.device(device):
        model = lstm_regressor(layers=2, units=128, steps=512, features=32)
        x = tf.random.stateless_normal([16, 512, 32], seed=[0, 1])

    def loss_of(t):
        return tf.reduce_mean(tf.square(model(t, training=True)))

    figures, loops = {}, []
    for name, tape in (("plain", tf.GradientTape),
                       ("memory", functools.partial(memgrad.GradientTape, checkpoints="memory"))):
        step = _sgd_step(model, loss_of, tape, jit_compile=False)
        with memgrad.record_rewrites() as log:
            with tf.device(device):
                step(x)
        loops += [loop for r in log for loop in r.loops]
        figures[name] = _median_peak_and_time(step, (x,), device)
    (plain_peak, plain_time), (peak, seconds) = figures["plain"], figures["memory"]
    note = (f"time {seconds / plain_time:.2f}x plain's; loops segmented: "
            f"{sum(loop.mode == 'segments' for loop in loops)} of {len(loops)}")
    return [_row("lstm/memory", "'memory' <= 0.40x plain's peak (T=512)",
                 f"{peak / plain_peak:.2f}x ({peak / MiB:.1f} of {plain_peak / MiB:.1f} MiB)",
                 peak <= 0.4 * plain_peak, note)]


def table(rows, device):
    lines = [f"| check | claim | CPU (2 cores) | {device} | met | note |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        met = {True: "yes", False: "**no**", None: "n/a"}[row["met"]]
        lines.append(f"| {row['check']} | {row['claim']} | {CPU_FIGURES.get(row['check'], '')} | "
                     f"{row['measured']} | {met} | {row['note']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", help="the device to check on (default: GPU:0 if there is one)")
    parser.add_argument("--check", choices=CHECKS, action="append", help="default: all")
    args = parser.parse_args(argv)
    import tensorflow as tf

    import memgrad  # noqa: F401 - before any model, as a user's script does

    device = args.device
    if device is None:
        if not tf.config.list_physical_devices("GPU"):
            print("gpu_check: no GPU is visible to TensorFlow, nothing to check "
                  "(--device CPU:0 runs the same checks on the CPU).")
            return 0
        device = "GPU:0"
    rows = []
    for name in args.check or CHECKS:
        start = time.perf_counter()
        rows += globals()[f"check_{name}"](device)
        print(f"gpu_check: {name} took {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(table(rows, device))
    return 1 if any(row["met"] is False for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
