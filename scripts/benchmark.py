"""memgrad's benchmark suite: time and memory ratios, each measured side by side in one run.

Timing is not asserted in the tests (wall time is noisy); it lives here. Every
variant is timed against plain backprop of the *same* network, in interleaved
rounds (variant, baseline, variant, ...), and the ratio of medians is reported.

Usage:
  python scripts/benchmark.py                      # every suite, print a markdown table
  python scripts/benchmark.py --suite reversible --rounds 20 --markdown reversible.md
  python scripts/benchmark.py --suite loops --check   # exit 1 when a stated target is missed
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # exact CPU memory figures

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import memgrad  # noqa: E402
from memgrad._src.checkpointing.plans import memory_plan  # noqa: E402
from memgrad._src.graph import ForwardGraph  # noqa: E402
from memgrad.profiler.workloads import (  # noqa: E402
    UNEVEN_WIDTHS, conv_classifier, gru_scan, lstm_regressor, residual_chain,
    transformer_classifier, uneven_chain)
from memgrad.layers import AdditiveCoupling, AffineCoupling, ReversibleSequence  # noqa: E402


def _sgd_step(variables, loss_of, tape=tf.GradientTape, jit_compile=None):
    """A compiled SGD step minimising ``loss_of(x)`` over ``variables`` (gradients from ``tape()``;
    ``jit_compile=True``: compiled with XLA)."""
    @tf.function(jit_compile=jit_compile)
    def step(x):
        with tape() as recorder:
            loss = loss_of(x)
        for variable, grad in zip(variables, recorder.gradient(loss, variables)):
            if isinstance(grad, tf.IndexedSlices):  # an embedding's: applied densely
                grad = tf.convert_to_tensor(grad)
            variable.assign_sub(1e-4 * grad)
        return loss

    return step


def _training_step(forward, variables):
    return _sgd_step(variables, lambda x: tf.reduce_mean(tf.square(forward(x))))


def time_rounds(steps, x, rounds):
    """Seconds of each call of each step (a list per step), timed in interleaved rounds after
    two warm-up calls each."""
    for step in steps.values():
        for _ in range(2):
            step(x).numpy()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step(x).numpy()
            times[name].append(time.perf_counter() - start)
    return times


def time_side_by_side(steps, x, rounds):
    """Median seconds per call of each step, timed in interleaved rounds."""
    return {name: statistics.median(values) for name, values in time_rounds(steps, x, rounds).items()}


def _conv_net(channels, seed):
    init = keras.initializers.HeNormal
    return keras.Sequential([
        keras.layers.Conv2D(channels, 3, padding="same", activation="relu", kernel_initializer=init(seed)),
        keras.layers.Conv2D(channels, 3, padding="same", kernel_initializer=init(seed + 1)),
    ])


def reversible_suite(rounds, batch=32, size=16, channels=64, depth=8):
    """Reversible stacks vs plain backprop of the same blocks (time and peak memory)."""
    half = channels // 2
    x = tf.random.stateless_normal([batch, size, size, channels], seed=[0, 1])
    variants = {
        "additive coupling (RevNet)": lambda i: AdditiveCoupling(_conv_net(half, 4 * i), _conv_net(half, 4 * i + 2)),
        "affine coupling, fused backward (Algorithm 2)": lambda i: AffineCoupling(
            _conv_net(half, 4 * i), _conv_net(half, 4 * i + 2), scale="sigmoid"),
        "affine coupling, invert then recompute (Algorithm 1)": lambda i: AffineCoupling(
            _conv_net(half, 4 * i), _conv_net(half, 4 * i + 2), scale="sigmoid", fused_backward=False),
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

        steps = {"memgrad": _training_step(stack, stack.trainable_variables),
                 "plain": _training_step(plain, stack.trainable_variables)}
        seconds = time_side_by_side(steps, x, rounds)
        peaks = {key: memgrad.profiler.measure(step, args=(x,)).peak_above_baseline_bytes for key, step in steps.items()}
        rows.append({
            "suite": "reversible",
            "case": f"{name}, {depth} blocks, batch {batch}x{size}x{size}x{channels}",
            "time_ratio": seconds["memgrad"] / seconds["plain"],
            "target": targets[name],
            "ms_memgrad": seconds["memgrad"] * 1e3,
            "ms_plain": seconds["plain"] * 1e3,
            "memory_ratio": peaks["memgrad"] / peaks["plain"],
        })
    return rows


def _eager_step(model, x, y):
    optimizer = keras.optimizers.SGD(1e-4)
    optimizer.build(model.trainable_variables)

    def step(_):
        with tf.GradientTape() as tape:
            logits = model(x, training=False)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step


def selective_suite(rounds, batch=32):
    """memgrad.selective.convert(model) vs the Keras model: eager training steps (time and peak memory)."""
    x = tf.random.stateless_normal([batch, 32, 32, 8], seed=[0, 1])
    y = tf.range(batch) % 10
    rows = []
    for frozen in (True, False):
        model = conv_classifier(frozen)
        steps = {"memgrad": _eager_step(memgrad.selective.convert(model), x, y), "plain": _eager_step(model, x, y)}
        seconds = time_side_by_side(steps, x, rounds)
        peaks = {key: memgrad.profiler.measure(step, args=(x,)).peak_above_baseline_bytes for key, step in steps.items()}
        rows.append({
            "suite": "selective",
            "case": (f"16 conv-BN-ReLU layers, {'frozen backbone + trainable head' if frozen else 'all trainable'}"
                     f", eager, batch {batch}x32x32"),
            "time_ratio": seconds["memgrad"] / seconds["plain"],
            "target": 1.05,
            "ms_memgrad": seconds["memgrad"] * 1e3,
            "ms_plain": seconds["plain"] * 1e3,
            "memory_ratio": peaks["memgrad"] / peaks["plain"],
        })
    rows += finetune_rows(rounds)
    return rows


def finetune_rows(rounds):
    """The fine-tuning workloads (keras.applications, keras-hub BERT with adapters):
    converted vs Keras, eager and tf.function steps (time and peak memory).

    The workloads live beside their tests (tests/selective/finetune_probe.py: keras-hub is a
    test-only dependency); without keras-hub the BERT row is skipped.
    """
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.selective import finetune_probe

    cases = {
        "resnet50_frozen": "keras.applications ResNet50 frozen + trainable head",
        "resnet50_batchnorm": "ResNet50, only BatchNormalization + head trainable",
        "mobilenetv2_frozen": "MobileNetV2 frozen + trainable head",
        "bert_adapters": "keras-hub BERT (2 layers, hidden 64) frozen, adapters + head trainable",
    }
    rows = []
    for name, title in cases.items():
        build, batch = finetune_probe.WORKLOADS[name]
        try:
            model = build()
        except ImportError as error:  # keras-hub not installed
            print(f"skipped {name}: {error}", file=sys.stderr)
            continue
        converted = memgrad.selective.convert(model)
        for graph in (False, True):
            steps = {key: finetune_probe.make_step(m, batch, graph) for key, m in
                     (("memgrad", converted), ("plain", model))}
            timed = {key: (lambda _, step=step: step()) for key, step in steps.items()}
            seconds = time_side_by_side(timed, None, rounds)
            peaks = {key: finetune_probe.step_peak(m, batch, graph) for key, m in (("memgrad", converted), ("plain", model))}
            rows.append({
                "suite": "selective",
                "case": f"{title}, {'tf.function' if graph else 'eager'}, batch {batch}",
                "time_ratio": seconds["memgrad"] / seconds["plain"],
                "target": 1.05,
                "ms_memgrad": seconds["memgrad"] * 1e3,
                "ms_plain": seconds["plain"] * 1e3,
                "memory_ratio": peaks["memgrad"] / peaks["plain"],
            })
    return rows


def _gradient_step(weights, loss_fn, gradients_fn):
    @tf.function
    def step(x):
        grads = gradients_fn(loss_fn(x), weights)
        for w, g in zip(weights, grads):
            w.assign_sub(1e-6 * g)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    return step


def _build_seconds(depth, width=8):
    """Seconds to analyse and rewrite (memgrad.gradients) vs build tf.gradients, at trace time."""
    weights, loss_fn = residual_chain(depth, width, seed=1)
    timings = {}

    @tf.function
    def trace(x):
        loss = loss_fn(x)
        timings["ops"] = len(loss.graph.get_operations())
        start = time.perf_counter()
        memgrad.analyze(ys=[loss], xs=weights, budget_points=0)
        timings["analysis"] = time.perf_counter() - start
        start = time.perf_counter()
        tf.gradients(loss, weights)
        timings["tf"] = time.perf_counter() - start
        start = time.perf_counter()
        with memgrad.record_rewrites() as log:
            memgrad.gradients(loss, weights)
        timings["memgrad"] = time.perf_counter() - start
        timings["memgrad_tf"] = log[-1].gradient_seconds
        return loss

    trace.get_concrete_function(tf.TensorSpec([4, width]))
    return timings


def checkpointing_suite(rounds, batch=4096, width=128, depth=64):
    """memgrad.gradients('memory') vs tf.gradients on a residual chain; trace-time cost."""
    x = tf.random.stateless_normal([batch, width], seed=[0, 1])
    weights, loss_fn = residual_chain(depth, width)
    steps = {"memgrad": _gradient_step(weights, loss_fn, memgrad.gradients),
             "plain": _gradient_step(weights, loss_fn, tf.gradients)}
    seconds = time_side_by_side(steps, x, rounds)
    peaks = {key: memgrad.profiler.measure(step, args=(x,)).peak_bytes for key, step in steps.items()}
    rows = [{
        "suite": "checkpointing",
        "case": f"checkpoints='memory', residual chain of {depth} layers, batch {batch}x{width}",
        "time_ratio": seconds["memgrad"] / seconds["plain"],
        "target": 1.3,
        "ms_memgrad": seconds["memgrad"] * 1e3,
        "ms_plain": seconds["plain"] * 1e3,
        "memory_ratio": peaks["memgrad"] / peaks["plain"],
    }]
    timings = _build_seconds(1250)
    total = timings["memgrad"]
    own = total - timings["memgrad_tf"]  # analysis + rewrite, without tf.gradients' own work
    rows.append({
        "suite": "checkpointing",
        "case": (f"trace time, graph of {timings['ops']} ops: analysis + rewrite {own:.2f} s "
                 f"(analysis alone {timings['analysis']:.2f} s); ms columns: all of "
                 "memgrad.gradients (with TensorFlow's gradient construction per segment) vs "
                 "tf.gradients"),
        "time_ratio": total / timings["tf"],
        "target_text": f"analysis + rewrite {own:.2f} s <= 3 s ({'met' if own <= 3 else 'missed'})",
        "ms_memgrad": total * 1e3,
        "ms_plain": timings["tf"] * 1e3,
        "memory_ratio": None,
    })
    return rows


def _sqrt_spacing_gradients(loss, variables):
    """memgrad.gradients keeping every round(sqrt(n))-th layer output of a ReLU chain."""
    relus = [op.outputs[0] for op in loss.graph.get_operations() if op.type == "Relu"]
    k = max(1, round(len(relus) ** 0.5))
    return memgrad.gradients(loss, variables, checkpoints=relus[k - 1:-1:k])


def _median_peak(step, x):
    """Median of three measured peaks: the executor's schedule moves each by a few MiB."""
    peaks = sorted(memgrad.profiler.measure(step, args=(x,)).peak_above_baseline_bytes for _ in range(3))
    return peaks[1]


def budget_suite(rounds, batch=2048):
    """memgrad.strategies.Budget at sqrt(n) spacing's measured peak, on a chain of uneven widths."""
    x = tf.random.stateless_normal([batch, UNEVEN_WIDTHS[-1]], seed=[0, 3])
    weights, loss_fn = uneven_chain()
    sqrt_step = _gradient_step(weights, loss_fn, _sqrt_spacing_gradients)
    plain_step = _gradient_step(weights, loss_fn, tf.gradients)
    sqrt_peak = _median_peak(sqrt_step, x)
    budget = memgrad.strategies.Budget(int(sqrt_peak))
    plans = []

    def budgeted(loss, variables):
        with memgrad.record_rewrites() as log:
            grads = memgrad.gradients(loss, variables, checkpoints=budget)
        plans.append(log[-1].plan)
        return grads

    budget_step = _gradient_step(weights, loss_fn, budgeted)
    steps = {"budget": budget_step, "sqrt": sqrt_step, "plain": plain_step}
    seconds = time_side_by_side(steps, x, rounds)
    peaks = {key: _median_peak(step, x) for key, step in steps.items()}
    last = dict(plans[-1].details)
    rows = [{
        "suite": "budget",
        "case": (f"Budget({sqrt_peak / 2**20:.1f} MiB = sqrt(n) spacing's measured peak), "
                 f"{len(weights)}-layer ReLU chain of widths 64-1024, batch {batch}: "
                 f"measured {peaks['budget'] / 2**20:.1f} MiB (predicted "
                 f"{last['predicted_bytes'] / 2**20:.1f}); time vs sqrt(n) spacing "
                 f"{seconds['budget'] / seconds['sqrt']:.2f}x "
                 f"({last['recomputed_flops'] / 1e9:.2f} GFLOP recomputed)"),
        "time_ratio": seconds["budget"] / seconds["plain"],
        "target_text": (f"time <= sqrt(n) spacing's "
                        f"({'met' if seconds['budget'] <= seconds['sqrt'] else 'missed'}), "
                        f"peak <= budget ({'met' if peaks['budget'] <= sqrt_peak else 'missed'})"),
        "ms_memgrad": seconds["budget"] * 1e3,
        "ms_plain": seconds["plain"] * 1e3,
        "memory_ratio": peaks["budget"] / peaks["plain"],
    }]
    planning = _planning_seconds(1250)
    rows.append({
        "suite": "budget",
        "case": (f"planning time at trace time, graph of {planning['ops']} ops (1250 residual "
                 f"layers), Budget(0.2): {planning['seconds']:.2f} s; ms columns: planning vs "
                 "the 'memory' strategy's analysis"),
        "time_ratio": planning["seconds"] / planning["memory"],
        "target_text": (f"<= 3 s ({'met' if planning['seconds'] <= 3 else 'missed'})"),
        "ms_memgrad": planning["seconds"] * 1e3,
        "ms_plain": planning["memory"] * 1e3,
        "memory_ratio": None,
    })
    return rows


def _planning_seconds(depth, width=128, batch=4096):
    weights, loss_fn = residual_chain(depth, width, seed=1)
    timings = {}

    @tf.function(autograph=False)
    def trace(x):
        loss = loss_fn(x)
        timings["ops"] = len(loss.graph.get_operations())
        view = ForwardGraph([loss], weights)
        start = time.perf_counter()
        memgrad.strategies.Budget(0.2).plan(view)
        timings["seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        memory_plan(ForwardGraph([loss], weights))
        timings["memory"] = time.perf_counter() - start
        return loss

    trace.get_concrete_function(tf.TensorSpec([batch, width]))
    return timings


def _classifier_step(model):
    def cross_entropy(x):
        logits = model(x, training=True)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            tf.zeros(tf.shape(x)[:1], tf.int32), logits, from_logits=True))

    return _sgd_step(model.trainable_variables, cross_entropy)


def _glow_twin_steps(size, steps_per_level, hidden, reversible_key, plain_key):
    """SGD steps of one Glow level trained through the constant-memory stack and by plain
    backprop, with the same weights: ``{reversible_key: step, plain_key: step}``."""
    from memgrad_zoo.glow import Glow

    glows = {key: Glow((size, size, 3), levels=1, steps=steps_per_level, hidden=hidden, n_bins=256,
                       reversible=key == reversible_key) for key in (reversible_key, plain_key)}
    for glow in glows.values():
        glow.build()
    glows[plain_key].set_weights(glows[reversible_key].get_weights())
    return {key: _sgd_step(glow.trainable_variables, lambda t, g=glow: tf.reduce_mean(g(t, training=True)))
            for key, glow in glows.items()}, glows


def zoo_suite(rounds, batch=16, size=16):
    """The model zoo: memory-efficient DenseNet-BC and constant-memory Glow vs their plain twins."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from memgrad_zoo.densenet import densenet_bc

    rows = []
    x = tf.random.stateless_normal([batch, size, size, 3], seed=[0, 1])
    steps = {key: _classifier_step(densenet_bc(100, 12, efficient=key == "memgrad", input_shape=(size, size, 3)))
             for key in ("memgrad", "plain")}
    rows.append(_zoo_row(f"DenseNet-BC-100 k=12, efficient vs plain, batch {batch}x{size}x{size}x3",
                         steps, x, rounds, 1.2))
    images = tf.random.stateless_uniform([64, size, size, 3], seed=[0, 2])
    steps, _ = _glow_twin_steps(size, 16, 32, "memgrad", "plain")
    rows.append(_zoo_row(f"Glow level (K=16, hidden 32), reversible vs plain, batch 64x{size}x{size}x3",
                         steps, images, rounds, 1.4))
    return rows


def _zoo_row(case, steps, x, rounds, target):
    seconds = time_side_by_side(steps, x, rounds)
    peaks = {key: _median_peak(step, x) for key, step in steps.items()}
    return {"suite": "zoo", "case": case, "time_ratio": seconds["memgrad"] / seconds["plain"],
            "target": target, "ms_memgrad": seconds["memgrad"] * 1e3, "ms_plain": seconds["plain"] * 1e3,
            "memory_ratio": peaks["memgrad"] / peaks["plain"]}



def _peer_row(case, variant, times, peaks, key, failure=None):
    """One row from ``times`` (`time_rounds`' seconds per round, per step) and ``peaks``:
    the median against plain's, and the fastest and slowest round."""
    if failure is not None:
        return {"suite": "peers", "case": case, "variant": variant, "failure": failure}
    median = statistics.median(times[key])
    return {"suite": "peers", "case": case, "variant": variant, "failure": None,
            "time_ratio": median / statistics.median(times["plain"]), "ms": median * 1e3,
            "ms_range": (min(times[key]) * 1e3, max(times[key]) * 1e3),
            "memory_ratio": peaks[key] / peaks["plain"], "peak_mib": peaks[key] / 2**20}


def _peer_rows(case, steps, x, rounds, failures=()):
    times = time_rounds(steps, x, rounds)
    peaks = {key: _median_peak(step, x) for key, step in steps.items()}
    rows = [_peer_row(case, key, times, peaks, key) for key in steps]
    return rows + [_peer_row(case, key, None, None, key, failure) for key, failure in failures]


def _try_step(make, x, tail=False):
    """``(step, None)`` if ``make()``'s step runs on ``x``, else ``(None, one-line reason)``:
    the message's first 200 characters, or its last 150 with ``tail`` (where TensorFlow names
    a tensor first and says what is wrong last)."""
    try:
        step = make()
        step(x).numpy()
        return step, None
    except Exception as error:  # noqa: BLE001 - a peer that fails is reported, not fatal
        from memgrad.cli.report import one_line

        message = one_line(error)
        message = "..." + message[-150:] if tail and len(message) > 150 else message[:200]
        return None, f"{type(error).__name__}: {message}"


def _add_step(steps, failures, label, make, x, tail=False):
    """Try ``make()``'s step on ``x`` (`_try_step`): into ``steps[label]`` if it runs, else
    ``(label, reason)`` into ``failures``."""
    step, failure = _try_step(make, x, tail=tail)
    if step is None:
        failures.append((label, failure))
    else:
        steps[label] = step


def peers_suite(rounds, batch=4096, width=128, depth=64, segment=8):
    """memgrad against other tools that trade compute for memory, each in the same run."""
    rows = []
    x = tf.random.stateless_normal([batch, width], seed=[0, 5])

    # 1. Residual chain: memgrad vs tf.recompute_grad over the same segments.
    weights = [tf.Variable(tf.random.stateless_normal([width, width], [5, i]) * 0.05) for i in range(depth)]

    def run_segment(h, ws):
        for w in ws:
            h = h + tf.nn.relu(h @ w)
        return h

    def chain_loss(t, boundaries=None, recompute=False):
        h = t
        for start in range(0, depth, segment):
            ws = weights[start:start + segment]
            if recompute:
                h = tf.recompute_grad(lambda v, ws=ws: run_segment(v, ws))(h)
            else:
                h = run_segment(h, ws)
            if boundaries is not None:
                boundaries.append(h)
        return tf.reduce_mean(h * h)

    def segments_gradients(t):
        boundaries = []
        loss = chain_loss(t, boundaries)
        return loss, memgrad.gradients(loss, weights, checkpoints=boundaries[:-1])

    def step_of(loss_and_grads):
        @tf.function
        def step(t):
            loss, grads = loss_and_grads(t)
            for w, g in zip(weights, grads):
                w.assign_sub(1e-4 * g)
            return loss
        return step

    def with_tape(loss_of):
        def run(t):
            with tf.GradientTape() as tape:
                loss = loss_of(t)
            return loss, tape.gradient(loss, weights)
        return run

    steps = {
        "plain": step_of(with_tape(chain_loss)),
        "memgrad, checkpoints at the segment ends": step_of(segments_gradients),
        "memgrad, checkpoints='memory'": step_of(lambda t: (lambda loss: (loss, memgrad.gradients(
            loss, weights, checkpoints="memory")))(chain_loss(t))),
        "tf.recompute_grad per segment": step_of(with_tape(lambda t: chain_loss(t, recompute=True))),
    }
    rows += _peer_rows(f"residual chain of {depth} layers in {depth // segment} segments, batch {batch}x{width}",
                       steps, x, rounds)

    # 2. A Keras model: memgrad.GradientTape vs keras.RematScope.
    def keras_chain():
        inputs = keras.Input((width,))
        h = inputs
        for i in range(depth // 2):
            h = keras.layers.Add()([h, keras.layers.Dense(width, activation="relu", name=f"d{i}",
                                                          kernel_initializer=keras.initializers.RandomNormal(
                                                              stddev=0.05, seed=i))(h)])
        return keras.Model(inputs, h)

    def keras_step(model, tape_factory):
        return _sgd_step(model.trainable_variables,
                         lambda t: tf.reduce_mean(tf.square(model(t, training=True))), tape_factory)

    steps, failures = {}, []
    plain_model = keras_chain()
    steps["plain"] = keras_step(plain_model, tf.GradientTape)
    steps["memgrad.GradientTape(checkpoints='memory')"] = keras_step(
        plain_model, lambda: memgrad.GradientTape(checkpoints="memory"))
    for mode in ("full", "activations"):
        def make(mode=mode):
            with keras.RematScope(mode=mode):
                model = keras_chain()
            return keras_step(model, tf.GradientTape)
        _add_step(steps, failures, f"keras.RematScope(mode='{mode}')", make, x)
    rows += _peer_rows(f"Keras functional model, {depth // 2} residual Dense layers, batch {batch}x{width}",
                       steps, x, rounds, failures)

    # 3. Glow: memgrad's constant-memory level vs tfp.bijectors.Glow, both one level of K=16.
    rows += _glow_peer_rows(rounds)
    # 4. A residual MLP of Keras layers: every memgrad strategy against the peers.
    rows += _mlp_peer_rows(rounds)
    rows += _mlp_peer_rows(rounds, batch=256, width=512, hidden=2048, gelu=True)
    # 5. Models nobody here wrote: keras-hub GPT-2 and keras.applications ResNet50.
    rows += _gpt2_peer_rows(rounds)
    rows += _resnet50_peer_rows(rounds)
    return rows


def _strategy_and_peer_rows(case, x, rounds, build, loss_of, recomputed_loss_of):
    """Plain backprop, memgrad's strategies, tf.recompute_grad per block and keras.RematScope
    on one model: ``build()`` makes it (inside a RematScope for that peer), ``loss_of(model)``
    its loss function of the input, ``recomputed_loss_of(model)`` the same loss with each
    block under tf.recompute_grad. Each step applies each gradient as it is made (one
    ``assign_sub`` per variable), so the Budget is told so (``hold_gradients=False``)."""
    model = build()
    steps, failures = {"plain": _sgd_step(model.trainable_variables, loss_of(model))}, []
    budget = memgrad.strategies.Budget(0.5, hold_gradients=False)
    for label, checkpoints in (("memgrad 'memory'", "memory"), ("memgrad 'speed'", "speed"),
                               ("memgrad Budget(0.5, hold_gradients=False)", budget)):
        _add_step(steps, failures, label, lambda c=checkpoints: _sgd_step(
            model.trainable_variables, loss_of(model), lambda c=c: memgrad.GradientTape(checkpoints=c)), x)
    recomputed = build()
    _add_step(steps, failures, "tf.recompute_grad per block", lambda: _sgd_step(
        recomputed.trainable_variables, recomputed_loss_of(recomputed)), x, tail=True)
    for mode in ("full", "activations"):
        def make(mode=mode):
            with keras.RematScope(mode=mode):
                remat = build()
            return _sgd_step(remat.trainable_variables, loss_of(remat))
        _add_step(steps, failures, f"keras.RematScope(mode='{mode}')", make, x)
    return _peer_rows(case, steps, x, rounds, failures)


def _gpt2_peer_rows(rounds, batch=8, length=128, layers=6, hidden=384, heads=6):
    """keras-hub's GPT2Backbone (random init, no dropout) on token ids; the loss is the mean
    square of its sequence output. tf.recompute_grad wraps each transformer layer."""
    import keras_hub

    def build():
        keras.utils.set_random_seed(0)
        return keras_hub.models.GPT2Backbone(
            vocabulary_size=1000, num_layers=layers, num_heads=heads, hidden_dim=hidden,
            intermediate_dim=4 * hidden, dropout=0.0, max_sequence_length=length)

    def forward(backbone, tokens, recompute=False):
        h = backbone.token_embedding(tokens)
        h = backbone.embeddings_add((h, backbone.position_embedding(h)))
        for layer in backbone.transformer_layers:
            h = tf.recompute_grad(layer)(h) if recompute else layer(h)
        return backbone.layer_norm(h)

    tokens = tf.random.stateless_uniform([batch, length], [0, 7], maxval=1000, dtype=tf.int32)
    case = f"keras-hub GPT2Backbone {layers}x{hidden} (random init), batch {batch}x{length} tokens"
    return _strategy_and_peer_rows(
        case, tokens, rounds, build,
        lambda m: lambda t: tf.reduce_mean(tf.square(forward(m, t))),
        lambda m: lambda t: tf.reduce_mean(tf.square(forward(m, t, recompute=True))))


def _resnet50_peer_rows(rounds, batch=16, size=64):
    """keras.applications ResNet50 (weights=None, 10 classes) in training mode; the loss is
    the mean square of its logits. tf.recompute_grad wraps each residual block (the model
    split at every ``conv*_block*_out``: single tensors between blocks)."""
    def build():
        keras.utils.set_random_seed(0)
        return keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=10)

    def pieces(model):
        ends = [layer.name for layer in model.layers if layer.name.endswith("_out")]
        tensors = [model.input] + [model.get_layer(name).output for name in ends] + [model.output]
        return [keras.Model(a, b) for a, b in zip(tensors[:-1], tensors[1:])]

    def recomputed_loss_of(model):
        parts = pieces(model)

        def loss(t):
            h = parts[0](t, training=True)
            for part in parts[1:-1]:
                h = tf.recompute_grad(lambda v, part=part: part(v, training=True))(h)
            return tf.reduce_mean(tf.square(parts[-1](h, training=True)))
        return loss

    x = tf.random.stateless_normal([batch, size, size, 3], seed=[0, 11])
    case = f"keras.applications ResNet50 (weights=None), batch {batch}x{size}x{size}x3"
    return _strategy_and_peer_rows(
        case, x, rounds, build,
        lambda m: lambda t: tf.reduce_mean(tf.square(m(t, training=True))), recomputed_loss_of)


def _residual_mlp(blocks, width, hidden, block_call=None, seed=0, activations=("relu", None)):
    """Residual blocks h + Dense(width, b)(Dense(hidden, a)(h)), ``activations`` (a, b), and a
    Dense(10) head; ``block_call(block, h)`` wraps each block's call (tf.recompute_grad),
    else it is plain."""
    first, second = activations
    keras.utils.set_random_seed(seed)
    blocks_ = [keras.Sequential([keras.Input((width,)), keras.layers.Dense(hidden, activation=first),
                                 keras.layers.Dense(width, activation=second)]) for _ in range(blocks)]
    head = keras.layers.Dense(10)
    head.build((None, width))

    def forward(x):
        h = x
        for block in blocks_:
            h = h + (block_call(block, h) if block_call else block(h))
        return head(h)

    variables = [v for b in blocks_ for v in b.trainable_variables] + head.trainable_variables
    return forward, variables


def _mlp_peer_rows(rounds, batch=1024, width=256, hidden=1024, blocks=32, gelu=False):
    """The residual MLP under plain backprop, memgrad's strategies, tf.recompute_grad per
    block and keras.RematScope, each step an SGD update of one ``assign_sub`` per variable
    (each applied as soon as its gradient is made: the Budget is told so). ``gelu``: both of
    a block's layers GELUs (whose gradients read their inputs), else Dense(relu) -> Dense."""
    x = tf.random.stateless_normal([batch, width], seed=[0, 9])
    kind = {"activations": ("gelu", "gelu") if gelu else ("relu", None)}
    first, second = kind["activations"]
    layers = f"Dense({hidden}, {first}) -> Dense({width}{f', {second}' if second else ''})"
    case = f"residual MLP, {blocks} blocks {layers}, batch {batch}x{width}"
    forward, variables = _residual_mlp(blocks, width, hidden, **kind)
    loss_of = lambda t: tf.reduce_mean(tf.square(forward(t)))  # noqa: E731
    steps, failures = {"plain": _sgd_step(variables, loss_of)}, []
    budget = memgrad.strategies.Budget(0.5, hold_gradients=False)
    for label, checkpoints in (("memgrad 'memory'", "memory"), ("memgrad 'speed'", "speed"),
                               ("memgrad Budget(0.5, hold_gradients=False)", budget)):
        _add_step(steps, failures, label, lambda c=checkpoints: _sgd_step(
            variables, loss_of, lambda c=c: memgrad.GradientTape(checkpoints=c)), x)
    recomputed, recomputed_variables = _residual_mlp(
        blocks, width, hidden, block_call=lambda block, h: tf.recompute_grad(block)(h), **kind)
    _add_step(steps, failures, "tf.recompute_grad per block", lambda: _sgd_step(
        recomputed_variables, lambda t: tf.reduce_mean(tf.square(recomputed(t)))), x, tail=True)
    for mode in ("full", "activations"):
        def make(mode=mode):
            with keras.RematScope(mode=mode):
                remat_forward, remat_variables = _residual_mlp(blocks, width, hidden, **kind)
            return _sgd_step(remat_variables, lambda t: tf.reduce_mean(tf.square(remat_forward(t))))
        _add_step(steps, failures, f"keras.RematScope(mode='{mode}')", make, x)
    return _peer_rows(case, steps, x, rounds, failures)


def _glow_peer_rows(rounds, batch=64, size=16, steps_per_level=16, hidden=32):
    import tensorflow_probability as tfp

    tfb, tfd = tfp.bijectors, tfp.distributions
    images = tf.random.stateless_uniform([batch, size, size, 3], seed=[0, 2], minval=-0.5, maxval=0.5)
    twins, glows = _glow_twin_steps(size, steps_per_level, hidden, "memgrad Glow, reversible", "plain")
    steps = {"plain": twins["plain"], "memgrad Glow, reversible": twins["memgrad Glow, reversible"]}
    failures = []
    try:
        bijector = tfb.Glow(output_shape=(size, size, 3), num_glow_blocks=1, num_steps_per_block=steps_per_level,
                            coupling_bijector_fn=lambda shape: tfb.GlowDefaultNetwork(shape, num_hidden=hidden),
                            exit_bijector_fn=None, seed=0)
        flow = tfd.TransformedDistribution(tfd.Sample(tfd.Normal(0.0, 1.0), [size * size * 3]), bijector)
        flow.log_prob(images)  # creates the variables
        dims = size * size * 3
        steps["tfp.bijectors.Glow, plain backprop"] = _sgd_step(
            flow.trainable_variables, lambda t: -tf.reduce_mean(flow.log_prob(t)) / (dims * math.log(2.0)))
        parameters = {key: sum(int(np.prod(v.shape)) for v in g.trainable_variables) for key, g in glows.items()}
        parameters["tfp"] = sum(int(np.prod(v.shape)) for v in flow.trainable_variables)
    except Exception as error:  # noqa: BLE001
        from memgrad.cli.report import one_line

        failures.append(("tfp.bijectors.Glow", f"{type(error).__name__}: {one_line(error)[:200]}"))
        parameters = None
    case = f"Glow, one level of K={steps_per_level} steps (hidden {hidden}), batch {batch}x{size}x{size}x3"
    if parameters:
        case += (f"; parameters: memgrad {parameters['plain']:,}, tfp {parameters['tfp']:,}")
    return _peer_rows(case, steps, images, rounds, failures)


def _recompute_blocks(depth, width, momentum, seed=0):
    """``depth`` blocks Dense(4w) -> BatchNormalization -> ReLU -> Dropout(0.1) -> Dense(w)."""
    keras.utils.set_random_seed(seed)
    blocks = []
    for _ in range(depth):
        block = keras.Sequential([keras.layers.Dense(4 * width), keras.layers.BatchNormalization(momentum=momentum),
                                  keras.layers.ReLU(), keras.layers.Dropout(0.1), keras.layers.Dense(width)])
        block.build((None, width))
        blocks.append(block)
    return blocks


def _bn_updates_per_step(moving_mean, plain_moving_mean, momentum):
    """Updates of a moving mean that started at 0, from its value and the plain step's (one update).

    After k updates with the same batch mean m, the moving mean is ``(1 - momentum**k) * m``.
    """
    batch_mean = plain_moving_mean / (1.0 - momentum)
    usable = np.abs(batch_mean) > 1e-3
    fraction = np.clip(moving_mean[usable] / batch_mean[usable], 1e-9, 1 - 1e-9)
    return float(np.median(np.log(1.0 - fraction) / np.log(momentum)))


def recompute_suite(rounds, batch=512, width=128, depth=16, momentum=0.5):
    """memgrad.recompute vs tf.recompute_grad vs keras.RematScope vs plain, per block, same model."""
    x = tf.random.stateless_normal([batch, width], seed=[0, 7])
    blocks = _recompute_blocks(depth, width, momentum)

    def state(block):  # weights, statistics and Dropout's seed state
        seeds = [layer.seed_generator.state for layer in block.layers if hasattr(layer, "seed_generator")]
        return block.weights + [v for v in seeds if all(v is not w for w in block.weights)]

    initial = [[v.numpy() for v in state(b)] for b in blocks]
    wrapped = [memgrad.layers.Recompute(b) for b in blocks]

    def forward_of(call_block):
        def forward(t):
            h = t
            for i in range(depth):
                h = h + call_block(i, h)
            return h
        return forward

    variants = {
        "plain": (blocks, forward_of(lambda i, h: blocks[i](h, training=True))),
        "memgrad.layers.Recompute per block": (blocks, forward_of(lambda i, h: wrapped[i](h, training=True))),
        "tf.recompute_grad per block": (blocks, forward_of(
            lambda i, h: tf.recompute_grad(lambda t, b=blocks[i]: b(t, training=True))(h))),
    }
    failures = []
    try:
        with keras.RematScope(mode="full"):
            remat_blocks = _recompute_blocks(depth, width, momentum)
        variants["keras.RematScope(mode='full')"] = (
            remat_blocks, forward_of(lambda i, h: remat_blocks[i](h, training=True)))
    except Exception as error:  # noqa: BLE001 - a peer that fails is reported, not fatal
        from memgrad.cli.report import one_line

        failures.append(("keras.RematScope(mode='full')", f"{type(error).__name__}: {one_line(error)[:200]}"))

    def reset(variant_blocks):
        for block, values in zip(variant_blocks, initial):
            for variable, value in zip(state(block), values):
                variable.assign(value)

    def variables_of(variant_blocks):
        return [v for b in variant_blocks for v in b.trainable_variables]

    def loss_of(forward):
        return lambda t: tf.reduce_mean(tf.square(forward(t)))

    # One step's gradients and BatchNormalization updates, from the same weights, seeds and statistics.
    checks, steps = {}, {}
    for name, (variant_blocks, forward) in variants.items():
        reset(variant_blocks)
        variables = variables_of(variant_blocks)

        def gradients_of(forward, variables):
            @tf.function
            def gradients(t):
                with tf.GradientTape() as tape:
                    loss = loss_of(forward)(t)
                return tape.gradient(loss, variables)
            return gradients

        gradients = gradients_of(forward, variables)

        try:
            grads = [None if g is None else g.numpy() for g in gradients(x)]
            missing = [v.path for v, g in zip(variables, grads) if g is None]
            if missing:
                raise ValueError(f"no gradient for {len(missing)} of {len(variables)} variables, e.g. {missing[0]}")
        except Exception as error:  # noqa: BLE001
            from memgrad.cli.report import one_line

            failures.append((name, f"{type(error).__name__}: {one_line(error)[:200]}"))
            continue
        moving_mean = variant_blocks[0].layers[1].moving_mean.numpy()
        checks[name] = (grads, moving_mean)
        reset(variant_blocks)
        steps[name] = _sgd_step(variables, loss_of(forward))
    if "plain" not in checks:
        raise RuntimeError(f"the plain variant failed: {failures}")
    plain_grads, plain_mean = checks["plain"]
    seconds = time_side_by_side(steps, x, rounds)
    peaks = {name: _median_peak(step, x) for name, step in steps.items()}
    rows = []
    for name in steps:
        grads, moving_mean = checks[name]
        error = max(float(np.max(np.abs(g - p)) / max(np.max(np.abs(p)), 1e-12)) for g, p in zip(grads, plain_grads))
        rows.append({"suite": "recompute", "variant": name, "failure": None,
                     "time_ratio": seconds[name] / seconds["plain"], "ms": seconds[name] * 1e3,
                     "memory_ratio": peaks[name] / peaks["plain"], "peak_mib": peaks[name] / 2**20,
                     "bn_updates": _bn_updates_per_step(moving_mean, plain_mean, momentum),
                     "gradient_error": error})
    rows += [{"suite": "recompute", "variant": name, "failure": failure} for name, failure in failures]
    case = (f"{depth} residual blocks Dense({4 * width})-BN-ReLU-Dropout(0.1)-Dense({width}), "
            f"batch {batch}x{width}, tf.function SGD step")
    for row in rows:
        row["case"] = case
    return rows


def _xla_workloads():
    weights, loss_fn = residual_chain(64, 128)
    yield "residual chain of 64 layers, batch 1024x128", weights, loss_fn, tf.random.stateless_normal(
        [1024, 128], seed=[0, 1])
    for case, model, shape in (
            ("12-layer transformer, 16 x 64 tokens x 64 features", transformer_classifier(), [16, 64, 64]),
            ("MobileNetV2 (keras.applications, weights=None), 16 x 64x64x3",
             keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3), classes=10),
             [16, 64, 64, 3])):
        def loss_of(x, model=model):
            return tf.reduce_mean(tf.square(model(x, training=True)))

        yield case, model.trainable_variables, loss_of, tf.random.stateless_normal(shape, seed=[0, 2])


def xla_suite(rounds):
    """checkpoints='memory' under XLA (jit_compile=True, Keras's default for fit on a GPU) vs
    plain XLA, and vs the same checkpointing with XLA off, side by side; on the first GPU if
    there is one, else on the CPU."""
    device = memgrad.profiler.default_device()
    # XLA asks for one large buffer per step, which a fresh BFC allocator rounds up to a whole
    # power-of-two region: grow the allocator first so each peak is what the step asks for.
    with tf.device(device):
        tf.reduce_sum(tf.zeros([2**28], tf.float32)).numpy()  # 1 GiB, freed at once
    variants = (("plain XLA", tf.GradientTape, True),
                ("memgrad XLA", functools.partial(memgrad.GradientTape, checkpoints="memory"), True),
                ("memgrad, XLA off", functools.partial(memgrad.GradientTape, checkpoints="memory"), False),
                ("plain, XLA off", tf.GradientTape, False))
    rows = []
    for case, variables, loss_of, x in _xla_workloads():
        steps = {name: _sgd_step(variables, loss_of, tape, jit) for name, tape, jit in variants}
        with tf.device(device):
            seconds = time_side_by_side(steps, x, rounds)
        peaks = {name: memgrad.profiler.measure(step, args=(x,), device=device).peak_bytes
                 for name, step in steps.items()}
        for name in steps:
            rows.append({"suite": "xla", "case": case, "variant": name, "device": device,
                         "time_ratio": seconds[name] / seconds["plain XLA"], "ms": seconds[name] * 1e3,
                         "vs_memgrad_no_xla": seconds[name] / seconds["memgrad, XLA off"],
                         "memory_ratio": peaks[name] / peaks["plain XLA"], "peak_mib": peaks[name] / 2**20})
    return rows


class _RecomputedLSTMCell(keras.layers.LSTMCell):
    """A Keras LSTM cell whose step runs under tf.recompute_grad (the peer of memgrad's
    segments: the cell's gates are recomputed in the backward, the step's inputs kept)."""

    def call(self, inputs, states, training=False):
        def step(x, h, c):
            output, (h, c) = super(_RecomputedLSTMCell, self).call(x, [h, c], training=training)
            return output, h, c

        output, h, c = tf.recompute_grad(step)(inputs, *states)
        return output, [h, c]


def _recomputed_lstm(layers, units, steps, features, seed):
    keras.utils.set_random_seed(seed)
    stack = [keras.Input((steps, features))]
    stack += [keras.layers.RNN(_RecomputedLSTMCell(units), return_sequences=True)
              for _ in range(layers)]
    return keras.Sequential(stack + [keras.layers.Dense(1)])


def _loop_rows(case, steps, x, rounds, device, peer=None):
    """Rows of the loops suite: each step in ``steps`` timed side by side and measured; ``peer``
    is ``(name, make)`` of a variant that may fail (reported as such)."""
    steps, failures = dict(steps), []
    if peer is not None:
        name, make = peer
        _add_step(steps, failures, name, make, x, tail=True)
    with tf.device(device):
        times = time_rounds(steps, x, rounds)
    peaks = {key: memgrad.profiler.measure(step, args=(x,), device=device).peak_bytes
             for key, step in steps.items()}
    rows = [_peer_row(case, key, times, peaks, key) for key in steps]
    rows += [_peer_row(case, key, None, None, key, failure) for key, failure in failures]
    return [dict(row, suite="loops") for row in rows]


def loops_suite(rounds, batch=16, units=128, steps=512, scan_steps=1024, xla=True, peers=True):
    """Memory through time: a 2-layer Keras LSTM and a GRU written with tf.scan, plain backprop
    vs memgrad (the loops' gradients in segments of steps) vs tf.recompute_grad around the
    cell (``peers``), one SGD step each, side by side, the LSTM also under XLA (``xla``)
    (target: <= 0.35x of plain's peak at <= 1.4x time)."""
    device = memgrad.profiler.default_device()
    memory = "memgrad.GradientTape('memory')"
    memory_tape = functools.partial(memgrad.GradientTape, checkpoints="memory")

    def squares_of(model):
        return lambda x: tf.reduce_mean(tf.square(model(x, training=True)))

    model = lstm_regressor(layers=2, units=units, steps=steps, features=32, seed=0)
    variables, loss_of = model.trainable_variables, squares_of(model)
    x = tf.random.stateless_normal([batch, steps, 32], seed=[0, 3])

    def recomputed_lstm():
        twin = _recomputed_lstm(2, units, steps, 32, seed=0)
        return _sgd_step(twin.trainable_variables, squares_of(twin))

    case = f"2-layer Keras LSTM ({units} units), {steps} steps, batch {batch}x{steps}x32"
    rows = _loop_rows(case, {"plain": _sgd_step(variables, loss_of),
                             memory: _sgd_step(variables, loss_of, memory_tape)},
                      x, rounds, device, ("tf.recompute_grad around the LSTM cell", recomputed_lstm) if peers else None)
    if xla:
        rows += _loop_rows(case + ", XLA (jit_compile=True)",
                           {"plain": _sgd_step(variables, loss_of, jit_compile=True),
                            memory: _sgd_step(variables, loss_of, memory_tape, jit_compile=True)},
                           x, rounds, device)

    weights, loss_fn = gru_scan(steps=scan_steps, units=256, features=64, seed=0)
    x = tf.random.stateless_normal([scan_steps, 32, 64], seed=[0, 4])

    def recomputed_gru():
        return _sgd_step(*gru_scan(steps=scan_steps, units=256, features=64, seed=0,
                                   recompute_cell=True))

    case = f"GRU as tf.scan over {scan_steps} steps (256 units), batch 32x64"
    rows += _loop_rows(case, {"plain": _sgd_step(weights, loss_fn),
                              memory: _sgd_step(weights, loss_fn, memory_tape)},
                       x, rounds, device, ("tf.recompute_grad around the cell", recomputed_gru) if peers else None)
    return rows


def long_suite(rounds, steps=4096):
    """Long sequences: the loops suite's 2-layer LSTM and tf.scan GRU over ``steps`` steps,
    plain backprop vs memgrad (target: <= 0.10x of plain's peak at <= 1.4x time)."""
    return [dict(row, suite="long") for row in loops_suite(
        rounds, steps=steps, scan_steps=steps, xla=False, peers=False)]


HIGHER_TARGETS = (0.9, 1e-5)  # 'memory' for both gradients: peak vs plain, gradient error


def higher_suite(rounds):
    """Gradients of gradients (scripts/higher_order.py's workloads at their defaults): a
    WGAN-GP critic step and a 2-layer LSTM's Hessian-vector product, nested tapes and two
    direct calls, each variant against plain (peak and time: medians of min(rounds, 5) calls;
    target: 'memory' for both gradients <= 0.9x of plain's peak, exact to 1e-5)."""
    import higher_order

    sizes = higher_order.parse_args([])
    rows = []
    for name in ("wgan", "lstm"):
        title, make_step, x = higher_order.workload(name, sizes)
        for entry in ("tape", "gradients"):
            results = higher_order.variant_results(make_step, x, entry, min(rounds, 5))
            plain_peak, plain_ms = results["plain"][:2]
            for variant, (peak, ms, error, calls) in results.items():
                rows.append({"suite": "higher", "case": f"{title}; entry: {entry}", "variant": variant,
                             "failure": None, "time_ratio": ms / plain_ms, "ms": ms,
                             "memory_ratio": peak / plain_peak, "peak_mib": peak,
                             "gradient_error": error, "calls": calls})
    return rows


SUITES = {
    "budget": budget_suite,
    "higher": higher_suite,
    "loops": loops_suite,
    "long": long_suite,
    "peers": peers_suite,
    "recompute": recompute_suite,
    "checkpointing": checkpointing_suite,
    "reversible": reversible_suite,
    "selective": selective_suite,
    "xla": xla_suite,
    "zoo": zoo_suite,
}


XLA_TIME_TARGET = 1.35  # memgrad under XLA vs plain XLA
LOOPS_TARGETS = (0.35, 1.4)  # memgrad's peak and time vs plain backprop through loops
LONG_TARGETS = (0.10, 1.4)  # the same over 4,096 steps


def missed(rows):
    """One line per stated target the run missed (the table's "missed"): a row's time ratio
    over its ``target``, a ``target_text`` saying missed, memgrad XLA over 1.35x plain XLA's
    time, memgrad through loops over 0.35x plain's peak or 1.4x its time (0.10x over 4,096 steps)."""
    lines = []
    for row in rows:
        if row.get("failure"):
            continue
        name = f"{row['suite']}: {row['case']}" + (f" [{row['variant']}]" if row.get("variant") else "")
        if row.get("target_text") is not None:
            if "missed" in row["target_text"]:
                lines.append(f"{name}: {row['target_text']}")
        elif row.get("target") is not None and row["time_ratio"] > row["target"]:
            lines.append(f"{name}: time {row['time_ratio']:.2f}x > {row['target']}x")
        elif (row["suite"] == "xla" and row.get("variant") == "memgrad XLA"
              and row["time_ratio"] > XLA_TIME_TARGET):
            lines.append(f"{name}: time {row['time_ratio']:.2f}x > {XLA_TIME_TARGET}x")
        elif row["suite"] == "higher" and row.get("variant") == "memory":
            peak, tolerance = HIGHER_TARGETS
            if row["memory_ratio"] > peak or row["gradient_error"] > tolerance:
                lines.append(f"{name}: peak {row['memory_ratio']:.2f}x (<= {peak}x), "
                             f"gradient error {row['gradient_error']:.1e} (<= {tolerance:.0e})")
        elif row["suite"] in ("loops", "long") and str(row.get("variant", "")).startswith("memgrad"):
            peak, time_target = LOOPS_TARGETS if row["suite"] == "loops" else LONG_TARGETS
            if row["memory_ratio"] > peak or row["time_ratio"] > time_target:
                lines.append(f"{name}: peak {row['memory_ratio']:.2f}x (<= {peak}x), "
                             f"time {row['time_ratio']:.2f}x (<= {time_target}x)")
    return lines


def _variant_table(intro, rows):
    """Markdown lines: ``intro``, then one row per variant (case, variant, time and peak vs
    plain), or the variant's failure."""
    ranged = any(row.get("ms_range") for row in rows)
    ms_header = "ms/step: median (fastest-slowest round)" if ranged else "ms/step"
    lines = ["", *intro, "",
             f"| case | variant | time vs plain | {ms_header} | peak memory vs plain | peak MiB |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if row["failure"]:
            lines.append(f"| {row['case']} | {row['variant']} | failed: {row['failure']} | | | |")
            continue
        ms = f"{row['ms']:.1f}"
        if row.get("ms_range"):
            ms += " ({:.1f}-{:.1f})".format(*row["ms_range"])
        lines.append(f"| {row['case']} | {row['variant']} | {row['time_ratio']:.2f}x | {ms} | "
                     f"{row['memory_ratio']:.2f}x | {row['peak_mib']:.1f} |")
    return lines


def markdown(rows) -> str:
    lines = [
        f"Measured on {platform.machine()} with {os.cpu_count()} CPU cores, Python "
        f"{platform.python_version()}, TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"device {memgrad.profiler.default_device()}.",
        "",
        "Plain means plain backprop of the same network (for `selective`: the unconverted Keras model).",
        "",
        "| suite | case | time vs plain | target | ms/step memgrad | ms/step plain | peak memory vs plain |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    peers = [row for row in rows if row["suite"] == "peers"]
    looped = [row for row in rows if row["suite"] == "loops"]
    long = [row for row in rows if row["suite"] == "long"]
    recomputed = [row for row in rows if row["suite"] == "recompute"]
    xla = [row for row in rows if row["suite"] == "xla"]
    higher = [row for row in rows if row["suite"] == "higher"]
    rows = [row for row in rows if row["suite"] not in ("peers", "recompute", "xla", "loops", "long", "higher")]
    if not rows:
        lines = lines[:2]
    for row in rows:
        target = row.get("target_text")
        if target is None:
            mark = "met" if row["time_ratio"] <= row["target"] else "missed"
            target = f"<= {row['target']}x ({mark})"
        memory = "n/a" if row["memory_ratio"] is None else f"{row['memory_ratio']:.2f}x"
        lines.append(
            f"| {row['suite']} | {row['case']} | {row['time_ratio']:.2f}x | {target} | "
            f"{row['ms_memgrad']:.1f} | {row['ms_plain']:.1f} | {memory} |"
        )
    if peers:
        lines += _variant_table(
            ["Peers: other tools that trade compute for memory, each measured in the same run against plain",
             "backprop of the same network (peak: median of three, above the weights)."], peers)
    if looped:
        lines += _variant_table(
            ["Loops: one SGD step through recurrent layers, every variant against plain backprop of the",
             "same network in the same run (target: memgrad <= {}x of plain's peak at <= {}x time).".format(
                 *LOOPS_TARGETS)],
            looped)
    if long:
        lines += _variant_table(
            ["Long sequences: the loops above over 4,096 steps, memgrad against plain backprop in the same",
             "run (target: memgrad <= {}x of plain's peak at <= {}x time).".format(*LONG_TARGETS)],
            long)
    if recomputed:
        lines += [
            "",
            f"Recompute per block: {recomputed[0]['case']}; same weights, seeds and statistics for each",
            "variant (peak: median of three; BN updates: BatchNormalization moving-mean updates per step,",
            "measured; gradient error: max relative error of one step's gradients vs plain).",
            "",
            "| variant | time vs plain | ms/step | peak memory vs plain | peak MiB | BN updates per step | gradient error vs plain |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in recomputed:
            if row["failure"]:
                lines.append(f"| {row['variant']} | failed: {row['failure']} | | | | | |")
            else:
                lines.append(f"| {row['variant']} | {row['time_ratio']:.2f}x | {row['ms']:.1f} | "
                             f"{row['memory_ratio']:.2f}x | {row['peak_mib']:.1f} | {row['bn_updates']:.2f} | "
                             f"{row['gradient_error']:.1e} |")
    if xla:
        lines += [
            "",
            f"XLA (jit_compile=True, Keras's default for `fit` on a GPU), on {xla[0]['device']}: one SGD "
            "step, every variant against plain XLA on the same network (target: memgrad XLA <= 1.35x).",
            "",
            "| case | variant | time vs plain XLA | time vs memgrad with XLA off | ms/step | "
            "peak memory vs plain XLA | peak MiB |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in xla:
            time_ratio = f"{row['time_ratio']:.2f}x"
            if row["variant"] == "memgrad XLA":
                time_ratio += f" ({'met' if row['time_ratio'] <= XLA_TIME_TARGET else 'missed'})"
            lines.append(f"| {row['case']} | {row['variant']} | {time_ratio} | {row['vs_memgrad_no_xla']:.2f}x | "
                         f"{row['ms']:.1f} | {row['memory_ratio']:.2f}x | {row['peak_mib']:.1f} |")
    if higher:
        lines += [
            "",
            "Gradients of gradients: an inner gradient and an outer one of a function of it; a variant",
            "names who takes each (inner, outer; plain: TensorFlow). Target: 'memory' for both "
            f"<= {HIGHER_TARGETS[0]}x",
            f"of plain's peak, exact to {HIGHER_TARGETS[1]:.0e}. memgrad calls: rewritten / planned as "
            "plain / fell back.",
            "",
            "| case | variant | time vs plain | ms/step | peak memory vs plain | peak MiB | "
            "gradient error vs plain | memgrad calls |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in higher:
            lines.append(f"| {row['case']} | {row['variant']} | {row['time_ratio']:.2f}x | {row['ms']:.1f} | "
                         f"{row['memory_ratio']:.2f}x | {row['peak_mib']:.1f} | {row['gradient_error']:.1e} | "
                         f"{row['calls']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), action="append",
                        help="suite to run (repeatable; default: all)")
    parser.add_argument("--peers", action="store_true", help="the peers suite (same as --suite peers)")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per variant (default: 15)")
    parser.add_argument("--markdown", metavar="PATH",
                        help="also write the table to PATH, a new file (an existing one is refused: "
                             "BENCHMARKS.md has hand-written sections; paste the rows into it)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the run misses a stated target (each is listed)")
    args = parser.parse_args(argv)
    if args.markdown and os.path.exists(args.markdown):
        # Checked before the suites run (they take minutes to hours): the table would
        # replace the whole file.
        parser.error(f"--markdown expected a new file; received {args.markdown!r}, which exists "
                     f"(the table would replace all of it: give a new path and paste the rows in)")
    rows = []
    if args.peers:
        args.suite = (args.suite or []) + ["peers"]
    for suite in args.suite or sorted(SUITES):
        rows += SUITES[suite](args.rounds)
    table = markdown(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as out:
            out.write("# memgrad benchmarks\n\nWritten by `python scripts/benchmark.py`.\n\n" + table + "\n")
    misses = missed(rows)
    for line in misses:
        print(f"missed: {line}", file=sys.stderr)
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
