"""Stateful layers, control flow, sparse gradients and bad input under memgrad.gradients."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from tests.checkpointing.models import (
    batchnorm_dropout,
    embedding,
    loss_fn,
    max_relative_error,
    rewritten,
)


def _train_once(model, x, y, use_memgrad):
    optimizer = keras.optimizers.SGD(0.1)
    variables = model.trainable_variables

    @tf.function
    def step(x, y):
        loss = loss_fn(y, model(x, training=True))
        if use_memgrad:
            grads = memgrad.gradients(loss, variables, checkpoints="memory")
        else:
            grads = tf.gradients(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    return float(step(x, y))


@pytest.mark.slow
def test_batchnorm_statistics_update_once_and_dropout_masks_match():
    keras.utils.set_random_seed(3)
    plain, x, y = batchnorm_dropout()
    checkpointed = keras.models.clone_model(plain)
    checkpointed.set_weights(plain.get_weights())
    # Same seeds: the dropout layers of both models draw the same masks.
    for a, b in zip(plain.layers, checkpointed.layers):
        if isinstance(a, keras.layers.Dropout):
            b.seed_generator.state.assign(a.seed_generator.state)
    loss_plain = _train_once(plain, x, y, use_memgrad=False)
    with rewritten():
        loss_ckpt = _train_once(checkpointed, x, y, use_memgrad=True)
    assert loss_ckpt == pytest.approx(loss_plain, rel=1e-6)
    # Moving statistics moved exactly once (twice would differ), and the weights match:
    # equal masks and equal gradients.
    for a, b in zip(plain.weights, checkpointed.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)
    moving = [w for w in plain.non_trainable_weights if "moving_mean" in w.path]
    assert moving and all(np.abs(w.numpy()).max() > 0 for w in moving)


def test_embedding_gradient_stays_sparse():
    keras.utils.set_random_seed(0)
    model, x, y = embedding()
    variables = model.trainable_variables

    @tf.function
    def step(x, y):
        loss = loss_fn(y, model(x, training=True))
        return tf.gradients(loss, variables), memgrad.gradients(loss, variables)

    with rewritten():
        reference, checkpointed = step(x, y)
    assert isinstance(reference[0], tf.IndexedSlices)
    assert isinstance(checkpointed[0], tf.IndexedSlices)
    assert max_relative_error(reference, checkpointed) <= 1e-5


def test_cond_and_while_are_kept_whole():
    weights = [tf.Variable(tf.random.stateless_normal([16, 16], [i, 0]) * 0.3) for i in range(8)]

    def forward(x):
        h = x
        for i, w in enumerate(weights):
            h = tf.tanh(h @ w)
            if i == 3:
                h = tf.cond(tf.reduce_sum(h) > -1e9, lambda: h * 2.0, lambda: h)
            if i == 5:
                h = tf.while_loop(lambda k, v: k < 3, lambda k, v: (k + 1, tf.sin(v)), (0, h))[1]
        return tf.reduce_sum(h * h)

    @tf.function
    def step(x):
        loss = forward(x)
        return tf.gradients(loss, weights), memgrad.gradients(loss, weights)

    with rewritten():
        reference, checkpointed = step(tf.random.stateless_normal([4, 16], [9, 9]))
    assert max_relative_error(reference, checkpointed) <= 1e-5


def test_gradient_with_respect_to_input_and_grad_ys():
    w = tf.Variable(tf.random.stateless_normal([8, 8], [1, 2]))

    @tf.function
    def step(x, dy):
        h = x
        for _ in range(10):
            h = tf.nn.softplus(h @ w)
        return (tf.gradients(h, [x, w], grad_ys=dy),
                memgrad.gradients(h, [x, w], grad_ys=dy))

    x = tf.random.stateless_normal([3, 8], [3, 4])
    dy = tf.random.stateless_normal([3, 8], [5, 6])
    with rewritten():
        reference, checkpointed = step(x, dy)
    assert max_relative_error(reference, checkpointed) <= 1e-5


def test_list_and_collection_checkpoints():
    w = [tf.Variable(tf.random.stateless_normal([8, 8], [i, 7]) * 0.5) for i in range(6)]

    @tf.function
    def step(x):
        h, marks = x, []
        for i, v in enumerate(w):
            h = tf.tanh(h @ v)
            if i % 2 == 1:
                marks.append(memgrad.mark_checkpoint(h))
        loss = tf.reduce_sum(h)
        return (tf.gradients(loss, w), memgrad.gradients(loss, w, checkpoints=marks),
                memgrad.gradients(loss, w, checkpoints="collection"))

    with rewritten(calls=2):
        reference, listed, collected = step(tf.ones([2, 8]))
    assert max_relative_error(reference, listed) <= 1e-5
    assert max_relative_error(reference, collected) <= 1e-5


def test_unconnected_variable_gets_none_or_zeros():
    used, unused = tf.Variable(tf.ones([4, 4])), tf.Variable(tf.ones([4, 4]))

    @tf.function
    def step(x):
        h = x
        for _ in range(6):
            h = tf.tanh(h @ used)
        loss = tf.reduce_sum(h)
        return (memgrad.gradients(loss, [used, unused]),
                memgrad.gradients(loss, [used, unused], unconnected_gradients="zero"))

    (g_used, g_none), (_, g_zero) = step(tf.ones([2, 4]))
    assert g_none is None
    assert float(tf.reduce_sum(tf.abs(g_zero))) == 0.0


# ---------------------------------------------------------------------- bad input
def test_eager_call_is_a_clear_error():
    x = tf.ones([2])
    with pytest.raises(RuntimeError, match="inside a graph"):
        memgrad.gradients(x * 2, x)


def test_no_x_connected_gives_none_or_zeros_like_tf_gradients():
    v = tf.Variable(1.0)

    @tf.function
    def step(x):
        loss = tf.reduce_sum(x * 2.0)
        return (memgrad.gradients(loss, [v]),
                memgrad.gradients(loss, [v], unconnected_gradients="zero"))

    none, zero = step(tf.ones([2]))
    assert none == [None]
    assert float(zero[0]) == 0.0


def test_checkpoint_outside_the_forward_pass_is_a_clear_error():
    v = tf.Variable(tf.ones([2, 2]))

    @tf.function
    def step(x):
        stray = x * 3.0
        loss = tf.reduce_sum(tf.tanh(x @ v))
        return memgrad.gradients(loss, [v], checkpoints=[stray])

    with pytest.raises(ValueError, match="not on a path from xs to ys"):
        step(tf.ones([2, 2]))


def test_unknown_mode_and_wrong_types_are_clear_errors():
    v = tf.Variable(tf.ones([2, 2]))

    @tf.function
    def step(x, mode):
        return memgrad.gradients(tf.reduce_sum(x @ v), [v], checkpoints=mode)

    with pytest.raises(ValueError, match="checkpoints must be one of"):
        step(tf.ones([2, 2]), "fastest")
    with pytest.raises(TypeError, match="list of graph"):
        tf.function(lambda x: memgrad.gradients(
            tf.reduce_sum(x @ v), [v], checkpoints=[np.ones(2)]))(tf.ones([2, 2]))


def test_collection_without_marks_is_a_clear_error():
    v = tf.Variable(tf.ones([2, 2]))

    @tf.function
    def step(x):
        return memgrad.gradients(tf.reduce_sum(tf.tanh(x @ v)), [v], checkpoints="collection")

    with pytest.raises(ValueError, match="found no marked tensor"):
        step(tf.ones([2, 2]))


def test_tiny_graph_falls_back_with_a_warning():
    v = tf.Variable(tf.ones([2, 2]))

    @tf.function
    def step(x):
        loss = tf.reduce_sum(x @ v)
        return tf.gradients(loss, [v]), memgrad.gradients(loss, [v])

    with warnings.catch_warnings(record=True) as caught, memgrad.record_rewrites() as log:
        warnings.simplefilter("always")
        reference, result = step(tf.ones([2, 2]))
    assert any("found nothing worth keeping" in str(w.message) for w in caught)
    np.testing.assert_allclose(reference[0].numpy(), result[0].numpy())
    # The record says why, as the warning did.
    assert log[0].fallback and "found nothing worth keeping" in log[0].fallback_reason, log[0]


def test_analyze_reports_separators_and_checkpoints():
    weights = [tf.Variable(tf.random.stateless_normal([64, 64], [i, 3]) * 0.1) for i in range(36)]

    def loss_fn(x):
        h = x
        for w in weights:
            h = h + tf.nn.relu(h @ w)
        return tf.reduce_mean(h * h)

    report = memgrad.analyze(loss_fn, tf.ones([256, 64]))
    assert len(report.separators) >= 36  # every residual sum separates the chain
    assert 3 <= len(report.checkpoints) <= 12  # about sqrt(36) segments
    assert report.estimated_ratio < 0.5
    text = report.summary()
    assert "separators found" in text and "checkpoints chosen" in text
    with pytest.raises(ValueError, match="function .* or both ys= and xs="):
        memgrad.analyze()



def test_analyze_takes_args_and_kwargs_like_measure():
    weights = [tf.Variable(tf.random.stateless_normal([32, 32], [i, 5]) * 0.1) for i in range(16)]

    def loss_fn(x, scale=1.0, depth=16):
        h = x
        for w in weights[:depth]:
            h = h + tf.nn.relu(h @ w)
        return tf.reduce_mean(h * h) * scale

    x = tf.ones([64, 32])
    inline = memgrad.analyze(loss_fn, x, scale=2.0, depth=12, budget_points=0)
    tuple_form = memgrad.analyze(loss_fn, args=(x,), kwargs={"scale": 2.0, "depth": 12},
                                 budget_points=0)
    single = memgrad.analyze(loss_fn, args=x, kwargs={"scale": 2.0, "depth": 12},
                             budget_points=0)
    for report in (tuple_form, single):
        assert report.checkpoints == inline.checkpoints
        assert report.forward_ops == inline.forward_ops
    # The kwargs reached fn: depth=12 traces fewer layers than the default 16.
    assert memgrad.analyze(loss_fn, args=[x], budget_points=0).forward_ops > inline.forward_ops
    with pytest.raises(TypeError, match="either as args= or inline"):
        memgrad.analyze(loss_fn, x, args=(x,))
    with pytest.raises(TypeError, match="either as kwargs= or inline"):
        memgrad.analyze(loss_fn, args=(x,), kwargs={"scale": 2.0}, depth=3)
    with pytest.raises(TypeError, match="Expected kwargs to be a dict.*Received: \\[1\\]"):
        memgrad.analyze(loss_fn, args=(x,), kwargs=[1])
    with pytest.raises(TypeError, match="Expected args to be a tuple or list.*Received: 3"):
        memgrad.analyze(loss_fn, args=3)
    with pytest.raises(ValueError, match="graph form takes ys= and xs= only"):
        memgrad.analyze(ys=[x], xs=[x], args=(x,))

def test_checkpoint_layer_marks_for_collection_and_round_trips(tmp_path):
    keras.utils.set_random_seed(4)
    inputs = keras.Input((16,))
    h = inputs
    for i in range(8):
        h = keras.layers.Dense(16, activation="tanh")(h)
        if i % 2:
            h = memgrad.layers.Checkpoint()(h)
    model = keras.Model(inputs, keras.layers.Dense(10)(h))
    x, y = tf.random.stateless_normal([8, 16], [0, 5]), tf.range(8) % 10

    @tf.function
    def step(x, y):
        loss = loss_fn(y, model(x, training=True))
        marked = tf.compat.v1.get_default_graph().get_collection("checkpoints")
        return (tf.gradients(loss, model.trainable_variables),
                memgrad.gradients(loss, model.trainable_variables, checkpoints="collection"),
                len(marked))

    with rewritten():
        reference, collected, marked = step(x, y)
    assert marked == 4
    assert max_relative_error(reference, collected) <= 1e-5
    path = str(tmp_path / "marked.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_allclose(restored(x).numpy(), model(x).numpy(), rtol=1e-6)


def test_copies_keep_the_original_device():
    weights = [tf.Variable(tf.random.stateless_normal([8, 8], [i, 1]) * 0.3) for i in range(12)]

    @tf.function
    def step(x):
        h = x
        for i, w in enumerate(weights):
            with tf.device("/cpu:1" if i % 2 else "/cpu:0"):
                h = tf.tanh(h @ w)
        return memgrad.gradients(tf.reduce_sum(h), weights)

    graph = step.get_concrete_function(tf.TensorSpec([4, 8])).graph
    copies = [op for op in graph.get_operations()
              if "/recompute" in op.name and op.type == "Tanh"]
    assert copies
    originals = {op.name: op.device for op in graph.get_operations()
                 if op.type == "Tanh" and "/recompute" not in op.name}
    for copy in copies:
        assert copy.device in set(originals.values()) and copy.device
    assert {c.device for c in copies} == set(originals.values())


@pytest.mark.slow
def test_speed_mode_never_runs_an_expensive_op_twice():
    keras.utils.set_random_seed(6)
    layers = keras.layers
    inputs = keras.Input((8, 8, 4))
    h = inputs
    for _ in range(6):
        conv = layers.Conv2D(4, 3, padding="same", use_bias=False)  # BN follows: no bias
        h = layers.ReLU()(layers.BatchNormalization()(conv(h)))
    model = keras.Model(inputs, layers.Dense(10)(layers.Flatten()(h)))
    x, y = tf.random.stateless_normal([4, 8, 8, 4], [1, 1]), tf.range(4)

    @tf.function
    def step(x, y):
        loss = loss_fn(y, model(x, training=True))
        return (tf.gradients(loss, model.trainable_variables),
                memgrad.gradients(loss, model.trainable_variables, checkpoints="speed"))

    with rewritten():
        reference, fast = step(x, y)
    assert max_relative_error(reference, fast) <= 1e-5
    graph = step.get_concrete_function(x, y).graph
    copied = [op.type for op in graph.get_operations() if "/recompute" in op.name]
    assert copied, "cheap ops (normalisation, ReLU) are recomputed"
    assert not [t for t in copied if t in ("Conv2D", "MatMul")]
