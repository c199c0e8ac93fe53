"""memgrad.recompute and memgrad.layers.Recompute: gradients equal plain autodiff of the same
forward computation (eager and tf.function), Keras seed generators replayed, BatchNormalization
statistics updated once, memory of a recomputed chain, .keras round trip, errors."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad._src import recompute as recompute_module
from memgrad._src.recompute import gate
from memgrad._src.replay import ReplayScope

MODES = ["eager", "graph"]
MODES_SLOW_GRAPH = ["eager", pytest.param("graph", marks=pytest.mark.slow)]  # traced: 3-6 s here


def max_relative_error(expected, received):
    worst = 0.0
    assert len(expected) == len(received)
    for a, b in zip(expected, received):
        assert (a is None) == (b is None)
        if a is None:
            continue
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        worst = max(worst, float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-12)))
    return worst


def run(fn, mode):
    return tf.function(fn) if mode == "graph" else fn


def state_of(layer):
    return [v.numpy() for v in layer.non_trainable_variables]


def set_state(layer, values):
    for variable, value in zip(layer.non_trainable_variables, values):
        variable.assign(value)


def layer_gradients(forward, layer, x, mode):
    """Gradients of a loss of ``forward(x)`` for ``x`` and ``layer``'s weights."""

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(x)
            loss = tf.reduce_sum(y * tf.sin(y))
        return tape.gradient(loss, [x] + layer.trainable_variables)

    return [g.numpy() for g in run(step, mode)(x)]


@pytest.mark.parametrize("mode", MODES_SLOW_GRAPH)
def test_function_with_variables_nested_inputs_and_kwargs_matches_autodiff(mode):
    w = tf.Variable(tf.random.stateless_normal([6, 5], seed=[1, 2]))
    b = tf.Variable(tf.random.stateless_normal([5], seed=[1, 3]))

    def fn(inputs, scale, power=2, training=False):
        h = tf.tanh(inputs["a"] @ w + b) * scale
        h = h ** power if training else h
        return {"y": h * tf.exp(inputs["c"]), "aux": (tf.reduce_sum(h), "not a tensor")}

    a = tf.random.stateless_normal([4, 6], seed=[2, 1])
    c = tf.random.stateless_normal([4, 5], seed=[2, 2])
    scale = tf.constant(1.5)

    def gradients(f):
        def step(a, c, scale):
            with tf.GradientTape() as tape:
                tape.watch([a, c, scale])
                out = f({"a": a, "c": c}, scale, power=3, training=True)
                assert out["aux"][1] == "not a tensor"
                loss = tf.reduce_sum(tf.sin(out["y"])) + out["aux"][0]
            return tape.gradient(loss, [a, c, scale, w, b])

        return [g.numpy() for g in run(step, mode)(a, c, scale)]

    expected, received = gradients(fn), gradients(memgrad.recompute(fn))
    assert all(g is not None for g in received)
    assert max_relative_error(expected, received) <= 1e-5


@pytest.mark.parametrize("mode", MODES)
def test_forward_keeps_nothing_for_an_outer_tape_and_backward_recomputes(mode):
    calls = []

    def fn(x):
        calls.append(tf.executing_eagerly())
        return tf.exp(tf.sin(x))

    x = tf.constant([0.1, 0.2, 0.3])

    def step(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = memgrad.recompute(fn, check_randomness=False)(x)  # the check would trace fn once more
        return tape.gradient(y, x)

    grad = run(step, mode)(x)
    assert calls == [mode == "eager"] * 2  # forward, then the recomputation (traced once each in a graph)
    np.testing.assert_allclose(grad, np.cos(x) * np.exp(np.sin(x)), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_layer_wrapper_matches_autodiff(mode):
    keras.utils.set_random_seed(3)
    inner = keras.Sequential([keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(8, activation="tanh")])
    wrapper = memgrad.layers.Recompute(inner)
    x = tf.random.stateless_normal([4, 12], seed=[3, 3])
    wrapper(x)
    expected = layer_gradients(lambda t: inner(t, training=True), inner, x, mode)
    received = layer_gradients(lambda t: wrapper(t, training=True), inner, x, mode)
    assert max_relative_error(expected, received) <= 1e-5


def dropout_block():
    keras.utils.set_random_seed(4)
    block = keras.Sequential([keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dropout(0.5), keras.layers.Dense(8)])
    block.build((None, 16))
    return block


@pytest.mark.parametrize("mode", MODES)
def test_dropout_mask_is_replayed(mode):
    block = dropout_block()
    x = tf.random.stateless_normal([8, 16], seed=[4, 4])
    seeds = state_of(block)
    expected = layer_gradients(lambda t: block(t, training=True), block, x, mode)
    set_state(block, seeds)
    received = layer_gradients(lambda t: memgrad.recompute(block)(t, training=True), block, x, mode)
    assert max_relative_error(expected, received) <= 1e-5
    # The seed generator advanced once per step, as in the plain step.
    set_state(block, seeds)
    layer_gradients(lambda t: block(t, training=True), block, x, mode)
    plain_after = state_of(block)
    set_state(block, seeds)
    layer_gradients(lambda t: memgrad.recompute(block)(t, training=True), block, x, mode)
    for a, b in zip(plain_after, state_of(block)):
        np.testing.assert_array_equal(a, b)


def test_without_the_replay_the_dropout_mask_differs(monkeypatch):
    """The comparison above can fail: replaying nothing draws a new mask in the recomputation."""
    monkeypatch.setattr(recompute_module, "ReplayScope", lambda state=(): ReplayScope(()))
    block = dropout_block()
    x = tf.random.stateless_normal([8, 16], seed=[4, 4])
    seeds = state_of(block)
    expected = layer_gradients(lambda t: block(t, training=True), block, x, "eager")
    set_state(block, seeds)
    received = layer_gradients(lambda t: memgrad.recompute(block)(t, training=True), block, x, "eager")
    assert max_relative_error(expected, received) > 1e-2


@pytest.mark.parametrize("mode", MODES)
def test_unseeded_keras_random_is_replayed(mode):
    """keras.random.* without a seed draws from Keras's global SeedGenerator: replayed too."""
    def fn(x):
        return x * keras.random.dropout(tf.ones_like(x), 0.5) + keras.random.normal(tf.shape(x))

    x = tf.random.stateless_normal([64], seed=[5, 5])

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = memgrad.recompute(fn)(x)
            loss = tf.reduce_sum(tf.sin(y) * y)
        return y, tape.gradient(loss, x)

    y, grad = run(step, mode)(x)
    with tf.GradientTape() as tape:  # autodiff of the forward the step actually ran
        tape.watch(y)
        loss = tf.reduce_sum(tf.sin(y) * y)
    mask_grad = tape.gradient(loss, y)
    mask = tf.cast(tf.not_equal(grad, 0.0), tf.float32)  # dropped elements have zero gradient
    assert 0 < float(tf.reduce_sum(mask)) < 64
    assert max_relative_error([mask_grad * mask * 2.0], [grad]) <= 1e-5


@pytest.mark.parametrize("mode", MODES)
def test_batchnorm_moving_statistics_updated_once(mode):
    keras.utils.set_random_seed(5)
    block = keras.Sequential([keras.layers.Dense(16), keras.layers.BatchNormalization(momentum=0.5),
                              keras.layers.ReLU(), keras.layers.Dense(4)])
    block.build((None, 8))
    x = tf.random.stateless_normal([32, 8], seed=[5, 6]) * 3.0 + 1.0
    initial = state_of(block)
    expected = layer_gradients(lambda t: block(t, training=True), block, x, mode)
    plain_after = state_of(block)
    set_state(block, initial)
    wrapper = memgrad.layers.Recompute(block)
    received = layer_gradients(lambda t: wrapper(t, training=True), block, x, mode)
    assert max_relative_error(expected, received) <= 1e-5
    after = state_of(block)
    assert any(np.max(np.abs(a - b)) > 1e-3 for a, b in zip(initial, plain_after))  # it moved
    for a, b in zip(plain_after, after):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_keras_fit_with_training_flag_from_the_model():
    """In model.fit Keras passes training=True implicitly; the wrapper hands it on, so the
    recomputation (run later, outside Keras's call context) sees the same mode."""
    keras.utils.set_random_seed(6)
    inner = keras.Sequential([keras.layers.Dense(16), keras.layers.BatchNormalization(),
                              keras.layers.ReLU(), keras.layers.Dropout(0.3)])
    head = keras.layers.Dense(1)
    model = keras.Sequential([keras.Input((8,)), memgrad.layers.Recompute(inner), head])
    plain = keras.Sequential([keras.Input((8,)), inner, head])  # the same layers, plain autodiff
    variables = model.weights + [inner.layers[-1].seed_generator.state]
    initial = [v.numpy() for v in variables]
    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    y = np.sum(x, axis=1, keepdims=True)
    trained = []
    for m in (plain, model):
        for variable, value in zip(variables, initial):
            variable.assign(value)
        m.compile(keras.optimizers.SGD(0.1), "mse")
        m.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
        trained.append([v.numpy() for v in variables])
    assert max_relative_error(trained[0], trained[1]) <= 1e-5
    assert max_relative_error(initial[:2], trained[0][:2]) > 1e-3  # it trained


def test_graph_recomputation_is_gated_by_a_data_dependency_on_the_gradient():
    @tf.function
    def gated(x, g):
        return gate([x], [g])[0]

    graph = gated.get_concrete_function(tf.TensorSpec([3]), tf.TensorSpec([3])).graph
    output = graph.outputs[0].op
    g = [op for op in graph.get_operations() if op.type == "Placeholder"][1]
    seen, pending = set(), [output]
    while pending:  # data inputs only, no control edges
        op = pending.pop()
        if op.name not in seen:
            seen.add(op.name)
            pending.extend(t.op for t in op.inputs)
    assert g.name in seen
    np.testing.assert_array_equal(gated(tf.ones([3]), tf.ones([3])), np.ones(3))
    assert np.isnan(gated(tf.ones([3]), tf.fill([3], float("nan"))).numpy()).all()


def recomputed_chain(wrap, depth=16, width=64):
    keras.utils.set_random_seed(8)
    blocks = []
    for _ in range(depth):
        block = keras.Sequential([keras.layers.Dense(4 * width, activation="relu"),
                                  keras.layers.Dense(width, activation="tanh")])
        block.build((None, width))
        blocks.append(memgrad.layers.Recompute(block) if wrap else block)
    return blocks


def chain_step(blocks):
    variables = [v for b in blocks for v in b.trainable_variables]

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for block in blocks:
                h = block(h, training=True)
            loss = tf.reduce_mean(h ** 2)
        return tape.gradient(loss, variables)

    return step


@pytest.mark.memory
@pytest.mark.slow
@pytest.mark.kernel_neutral  # 44.1 and 12.8 MiB with oneDNN's kernels, 45.0 and 12.7 without
def test_recomputed_chain_peaks_well_below_plain():
    """16 blocks Dense(256, relu) -> Dense(64) at batch 2048 in a tf.function: measured 12.6 MiB
    recomputed vs 44-69 MiB plain (0.18-0.29x, the plain schedule varies between runs); plain
    keeps every block's 2 MiB hidden activation, the recomputed chain the 0.5 MiB block inputs
    and one block's hidden activation."""
    x = tf.random.stateless_normal([2048, 64], seed=[8, 8])
    peaks = {wrap: memgrad.profiler.measure(chain_step(recomputed_chain(wrap)), args=(x,))
             .peak_above_baseline_bytes for wrap in (False, True)}
    assert peaks[False] > 40 * 2**20
    assert peaks[True] <= 0.4 * peaks[False], {k: v / 2**20 for k, v in peaks.items()}


def test_keras_round_trip(tmp_path):
    keras.utils.set_random_seed(9)
    inputs = keras.Input((6,))
    h = memgrad.layers.Recompute(keras.Sequential([keras.layers.Dense(8), keras.layers.BatchNormalization(),
                                                   keras.layers.Dropout(0.2)]), name="block")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(h))
    x = np.random.default_rng(1).normal(size=(4, 6)).astype("float32")
    path = str(tmp_path / "recompute.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    block = loaded.get_layer("block")
    assert isinstance(block, memgrad.layers.Recompute) and isinstance(block.layer, keras.Sequential)
    np.testing.assert_allclose(loaded(x, training=False), model(x, training=False), rtol=1e-6)


def test_errors():
    with pytest.raises(TypeError, match=r"expects a callable.*Received: 3 of type int"):
        memgrad.recompute(3)
    with pytest.raises(ValueError, match=r"wraps a Keras layer.*Received: .*function"):
        memgrad.layers.Recompute(tf.nn.relu)


@pytest.mark.parametrize("mode", MODES)
def test_stateful_random_op_is_refused_with_its_name(mode):
    fn = memgrad.recompute(lambda x: tf.nn.dropout(x, 0.5))

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x)

    with pytest.raises(ValueError, match=r"stateful random op.*stateless.*Received: RandomUniform op '"):
        run(step, mode)(tf.ones([4]))
    # Without a tape nothing is recomputed, so nothing is refused.
    assert fn(tf.ones([4])).shape == (4,)
