"""Gradients of memgrad's gradients: equal to plain autodiff's, or plain tf.gradients with one
warning naming the cause; never a silently wrong, None or crashing gradient."""

import warnings

import networkx as nx
import pytest
import tensorflow as tf

import memgrad
from memgrad._src.checkpointing import api
from memgrad._src.checkpointing import rewrite as rewrite_module

RTOL = 1e-5
DEPTH, WIDTH, BATCH = 8, 32, 16

STRATEGIES = [
    pytest.param("memory", id="memory"),
    pytest.param("speed", id="speed"),
    pytest.param("collection", id="collection"),
    pytest.param(memgrad.strategies.Budget(0.7), id="budget0.7"),
]
ENTRIES = ["gradients", "tape"]


def _relative_error(got, expected):
    assert got is not None, "memgrad gave None where plain autodiff gives a gradient"
    got, expected = tf.convert_to_tensor(got), tf.convert_to_tensor(expected)
    scale = float(tf.reduce_max(tf.abs(expected)))
    return float(tf.reduce_max(tf.abs(got - expected))) / max(scale, 1e-30)


def _assert_close(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert _relative_error(g, e) <= RTOL


@pytest.fixture
def recorded():
    """Every warning and every memgrad call of the test."""
    with warnings.catch_warnings(record=True) as caught, memgrad.record_rewrites() as log:
        warnings.simplefilter("always")
        yield caught, log


def _fallback_warnings(caught):
    return [str(w.message) for w in caught if "cannot rewrite" in str(w.message)]


# ---------------------------------------------------------------------- a residual chain
_W = tf.Variable(tf.random.stateless_normal([WIDTH, WIDTH], [0, 1]) * 0.1)
_X = tf.random.stateless_normal([BATCH, WIDTH], [0, 2])


def _chain(x):
    h = x
    for i in range(DEPTH):
        h = h + tf.tanh(h @ _W)
        if i % 2:
            h = memgrad.checkpoint(h)  # for 'collection'; a no-op for the other strategies
    return tf.reduce_sum(h ** 2)


def _inner_gradient(entry, checkpoints, x):
    """d chain / dx by memgrad (called inside whatever tape the caller has open)."""
    if entry == "gradients":
        return memgrad.gradients(_chain(x), x, checkpoints=checkpoints)[0]
    with memgrad.GradientTape(checkpoints=checkpoints) as inner:
        inner.watch(x)
        loss = _chain(x)
    return inner.gradient(loss, x)


def _assert_rewritten(log):
    """The first-order call really recomputed (no plain tf.gradients in disguise)."""
    assert log, "memgrad.gradients was not called"
    assert not log[0].fallback and log[0].copied_ops > 0, log[0]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("checkpoints", STRATEGIES)
def test_an_outer_tape_differentiates_through_the_recomputed_forward(
        checkpoints, entry, recorded):
    """d/d(w, x) of ||d loss/dx||^2 with memgrad's gradient inside a tf.GradientTape equals
    the same with tf.GradientTape inside: the recomputed copies are recorded on the outer
    tape (they used to be constants to it: relative error 1.3 with 'memory')."""
    caught, log = recorded

    @tf.function
    def step(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            penalty = tf.reduce_sum(_inner_gradient(entry, checkpoints, x) ** 2)
        got = outer.gradient(penalty, [_W, x])
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = _chain(x)
            penalty = tf.reduce_sum(inner.gradient(loss, x) ** 2)
        return got, outer.gradient(penalty, [_W, x])

    got, expected = step(_X)
    _assert_close(got, expected)
    _assert_rewritten(log)
    assert not _fallback_warnings(caught)


@pytest.mark.parametrize("checkpoints", STRATEGIES)
def test_tf_gradients_of_memgrad_gradients_equal_those_of_tf_gradients(checkpoints, recorded):
    """In graph mode the recomputed copies are ordinary ops: tf.gradients goes through them."""
    caught, log = recorded

    @tf.function
    def step(x):
        got = tf.reduce_sum(_inner_gradient("gradients", checkpoints, x) ** 2)
        expected = tf.reduce_sum(tf.gradients(_chain(x), x)[0] ** 2)
        return tf.gradients(got, [_W, x]), tf.gradients(expected, [_W, x])

    got, expected = step(_X)
    _assert_close(got, expected)
    _assert_rewritten(log)
    assert not _fallback_warnings(caught)


@pytest.mark.parametrize("checkpoints", ["memory", "speed"])
def test_memgrad_tapes_nested_give_the_second_derivative(checkpoints, recorded):
    """memgrad.GradientTape inside memgrad.GradientTape: the outer one rewrites the inner
    one's gradient graph, recomputed copies included."""
    caught, log = recorded

    @tf.function
    def step(x):
        with memgrad.GradientTape(checkpoints=checkpoints) as outer:
            outer.watch(x)
            penalty = tf.reduce_sum(_inner_gradient("tape", checkpoints, x) ** 2)
        got = outer.gradient(penalty, [_W, x])
        expected = tf.reduce_sum(tf.gradients(_chain(x), x)[0] ** 2)
        return got, tf.gradients(expected, [_W, x])

    got, expected = step(_X)
    _assert_close(got, expected)
    _assert_rewritten(log)
    assert not _fallback_warnings(caught)
