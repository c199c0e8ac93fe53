"""memgrad against its peers (tf.recompute_grad per block, Keras's own) on the same workloads."""

from __future__ import annotations

import math
import statistics

import keras
import numpy as np
import tensorflow as tf

import memgrad

from benchmarks.common import median_peak, sgd_step, time_rounds
from benchmarks.zoo import glow_twin_steps


def peer_row(case, variant, times, peaks, key, failure=None):
    """One row from ``times`` (`time_rounds`' seconds per round, per step) and ``peaks``:
    the median against plain's, and the fastest and slowest round."""
    if failure is not None:
        return {"suite": "peers", "case": case, "variant": variant, "failure": failure}
    median = statistics.median(times[key])
    return {"suite": "peers", "case": case, "variant": variant, "failure": None,
            "time_ratio": median / statistics.median(times["plain"]), "ms": median * 1e3,
            "ms_range": (min(times[key]) * 1e3, max(times[key]) * 1e3),
            "memory_ratio": peaks[key] / peaks["plain"], "peak_mib": peaks[key] / 2**20}


def peer_rows(case, steps, x, rounds, failures=()):
    times = time_rounds(steps, x, rounds)
    peaks = {key: median_peak(step, x) for key, step in steps.items()}
    rows = [peer_row(case, key, times, peaks, key) for key in steps]
    return rows + [peer_row(case, key, None, None, key, failure) for key, failure in failures]


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


def add_step(steps, failures, label, make, x, tail=False):
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
    rows += peer_rows(f"residual chain of {depth} layers in {depth // segment} segments, batch {batch}x{width}",
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
        return sgd_step(model.trainable_variables,
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
        add_step(steps, failures, f"keras.RematScope(mode='{mode}')", make, x)
    rows += peer_rows(f"Keras functional model, {depth // 2} residual Dense layers, batch {batch}x{width}",
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
    steps, failures = {"plain": sgd_step(model.trainable_variables, loss_of(model))}, []
    budget = memgrad.strategies.Budget(0.5, hold_gradients=False)
    for label, checkpoints in (("memgrad 'memory'", "memory"), ("memgrad 'speed'", "speed"),
                               ("memgrad Budget(0.5, hold_gradients=False)", budget)):
        add_step(steps, failures, label, lambda c=checkpoints: sgd_step(
            model.trainable_variables, loss_of(model), lambda c=c: memgrad.GradientTape(checkpoints=c)), x)
    recomputed = build()
    add_step(steps, failures, "tf.recompute_grad per block", lambda: sgd_step(
        recomputed.trainable_variables, recomputed_loss_of(recomputed)), x, tail=True)
    for mode in ("full", "activations"):
        def make(mode=mode):
            with keras.RematScope(mode=mode):
                remat = build()
            return sgd_step(remat.trainable_variables, loss_of(remat))
        add_step(steps, failures, f"keras.RematScope(mode='{mode}')", make, x)
    return peer_rows(case, steps, x, rounds, failures)


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
    steps, failures = {"plain": sgd_step(variables, loss_of)}, []
    budget = memgrad.strategies.Budget(0.5, hold_gradients=False)
    for label, checkpoints in (("memgrad 'memory'", "memory"), ("memgrad 'speed'", "speed"),
                               ("memgrad Budget(0.5, hold_gradients=False)", budget)):
        add_step(steps, failures, label, lambda c=checkpoints: sgd_step(
            variables, loss_of, lambda c=c: memgrad.GradientTape(checkpoints=c)), x)
    recomputed, recomputed_variables = _residual_mlp(
        blocks, width, hidden, block_call=lambda block, h: tf.recompute_grad(block)(h), **kind)
    add_step(steps, failures, "tf.recompute_grad per block", lambda: sgd_step(
        recomputed_variables, lambda t: tf.reduce_mean(tf.square(recomputed(t)))), x, tail=True)
    for mode in ("full", "activations"):
        def make(mode=mode):
            with keras.RematScope(mode=mode):
                remat_forward, remat_variables = _residual_mlp(blocks, width, hidden, **kind)
            return sgd_step(remat_variables, lambda t: tf.reduce_mean(tf.square(remat_forward(t))))
        add_step(steps, failures, f"keras.RematScope(mode='{mode}')", make, x)
    return peer_rows(case, steps, x, rounds, failures)


def _glow_peer_rows(rounds, batch=64, size=16, steps_per_level=16, hidden=32):
    import tensorflow_probability as tfp

    tfb, tfd = tfp.bijectors, tfp.distributions
    images = tf.random.stateless_uniform([batch, size, size, 3], seed=[0, 2], minval=-0.5, maxval=0.5)
    twins, glows = glow_twin_steps(size, steps_per_level, hidden, "memgrad Glow, reversible", "plain")
    steps = {"plain": twins["plain"], "memgrad Glow, reversible": twins["memgrad Glow, reversible"]}
    failures = []
    try:
        bijector = tfb.Glow(output_shape=(size, size, 3), num_glow_blocks=1, num_steps_per_block=steps_per_level,
                            coupling_bijector_fn=lambda shape: tfb.GlowDefaultNetwork(shape, num_hidden=hidden),
                            exit_bijector_fn=None, seed=0)
        flow = tfd.TransformedDistribution(tfd.Sample(tfd.Normal(0.0, 1.0), [size * size * 3]), bijector)
        flow.log_prob(images)  # creates the variables
        dims = size * size * 3
        steps["tfp.bijectors.Glow, plain backprop"] = sgd_step(
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
    return peer_rows(case, steps, images, rounds, failures)
