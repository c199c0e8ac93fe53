"""Property tests over dtypes: reversible stacks, `memgrad.recompute` and `memgrad.layers.Recompute`
give the outputs and gradients of the plain computation, under float32, float64, the mixed
policies and integer inputs."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memgrad
from memgrad.layers import AdditiveCoupling, AffineCoupling, ReversibleSequence
from tests.reversible.stacks import plain_forward

CONFIGS = ["float32", "float64", "mixed_float16", "mixed_bfloat16", "int32 input"]
# Relative tolerances (against the largest magnitude) on (outputs, gradients). Reversible stacks
# rebuild activations instead of keeping them: under the mixed policies their networks recompute
# in 16 bits, so the rebuilt inputs, and the gradients, carry that rounding.
REVERSIBLE_TOLERANCE = {"float32": (1e-5, 1e-4), "float64": (1e-12, 1e-10), "mixed_float16": (1e-3, 3e-2),
                        "mixed_bfloat16": (1e-2, 1e-1), "int32 input": (1e-5, 1e-4)}
# Recomputation runs the same ops in the same dtype again.
RECOMPUTE_TOLERANCE = {"float32": (1e-6, 1e-5), "float64": (1e-14, 1e-12), "mixed_float16": (1e-3, 1e-3),
                       "mixed_bfloat16": (1e-2, 1e-2), "int32 input": (1e-6, 1e-5)}
SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@contextlib.contextmanager
def _policy(config):
    """The global dtype policy for ``config`` while building and running, restored after."""
    previous = keras.config.dtype_policy()
    policy = {"float64": "float64", "mixed_float16": "mixed_float16",
              "mixed_bfloat16": "mixed_bfloat16"}.get(config, "float32")
    keras.config.set_dtype_policy(policy)
    try:
        yield keras.dtype_policies.get(policy)
    finally:
        keras.config.set_dtype_policy(previous)


def _input(config, batch, channels, seed, policy):
    rng = np.random.RandomState(seed)
    if config == "int32 input":
        return tf.constant(rng.randint(-3, 4, size=(batch, channels)), tf.int32)
    return tf.cast(tf.constant(rng.randn(batch, channels)), policy.compute_dtype)


def _dense(units, seed, activation):
    return keras.layers.Dense(units, activation=activation,
                              kernel_initializer=keras.initializers.RandomNormal(stddev=0.3, seed=seed))


def _loss(y):
    return tf.reduce_sum(tf.sin(tf.cast(y, tf.float32)))


def _relative(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)


def _assert_matches(config, table, got, want, got_grads, want_grads):
    output_tolerance, gradient_tolerance = table[config]
    assert got.dtype == want.dtype
    assert _relative(got, want) <= output_tolerance
    assert len(got_grads) == len(want_grads) > 0
    for g, w in zip(got_grads, want_grads):
        assert g is not None and w is not None
        assert _relative(g, w) <= gradient_tolerance


@pytest.mark.parametrize("config", CONFIGS)
@SETTINGS
@given(kind=st.sampled_from(["additive", "affine"]),
       depth=st.integers(1, 3), batch=st.integers(1, 4), half=st.integers(2, 4), seed=st.integers(0, 99))
def test_reversible_stack_matches_plain_autodiff(config, kind, depth, batch, half, seed):
    with _policy(config) as policy:
        if kind == "additive":
            blocks = [AdditiveCoupling(_dense(half, seed + 2 * i, "tanh"), _dense(half, seed + 2 * i + 1, "tanh"))
                      for i in range(depth)]
        else:
            blocks = [AffineCoupling(_dense(half, seed + 2 * i, "tanh"), _dense(half, seed + 2 * i + 1, None))
                      for i in range(depth)]
        stack = ReversibleSequence(blocks)
        x = _input(config, batch, 2 * half, seed, policy)
        with tf.GradientTape() as tape:
            y = stack(x, training=True)
            loss = _loss(y)
        grads = tape.gradient(loss, stack.trainable_variables)
        # The same forward computation, differentiated by plain autodiff.
        x_float = tf.cast(x, stack.compute_dtype)
        with tf.GradientTape() as tape:
            y_plain = plain_forward(blocks, x_float, training=True, dtype=stack.invertible_dtype)[0]
            loss_plain = _loss(y_plain)
        plain_grads = tape.gradient(loss_plain, stack.trainable_variables)
    assert y.dtype == tf.as_dtype(policy.compute_dtype)
    _assert_matches(config, REVERSIBLE_TOLERANCE, y, y_plain, grads, plain_grads)


@pytest.mark.parametrize("config", CONFIGS)
@SETTINGS
@given(batch=st.integers(1, 4), width=st.integers(2, 6),
       seed=st.integers(0, 99), graph=st.booleans())
def test_recompute_matches_plain_autodiff(config, batch, width, seed, graph):
    with _policy(config) as policy:
        block = keras.Sequential([_dense(2 * width, seed, "tanh"), _dense(width, seed + 1, None)])
        x = _input(config, batch, width, seed, policy)
        block.build((None, width))
        wrapped = memgrad.recompute(block)

        def step(fn, x):
            with tf.GradientTape() as tape:
                y = fn(x, training=True)
                loss = _loss(y)
            return y, tape.gradient(loss, block.trainable_variables)

        run = tf.function(step) if graph else step
        y, grads = run(wrapped, x)
        y_plain, plain_grads = run(block, x)
    assert y.dtype == tf.as_dtype(policy.compute_dtype)
    _assert_matches(config, RECOMPUTE_TOLERANCE, y, y_plain, grads, plain_grads)


@pytest.mark.parametrize("config", CONFIGS)
@SETTINGS
@given(batch=st.integers(1, 4), width=st.integers(2, 6), seed=st.integers(0, 99))
def test_recompute_layer_matches_plain_autodiff(config, batch, width, seed):
    with _policy(config) as policy:
        def model(recomputed):
            inner = keras.Sequential([_dense(2 * width, seed, "tanh"), _dense(width, seed + 1, None)])
            inputs = keras.Input((width,), dtype="int32" if config == "int32 input" else policy.compute_dtype)
            outputs = (memgrad.layers.Recompute(inner) if recomputed else inner)(inputs)
            return keras.Model(inputs, outputs)

        x = _input(config, batch, width, seed, policy)
        results = []
        for recomputed in (True, False):
            m = model(recomputed)
            with tf.GradientTape() as tape:
                y = m(x, training=True)
                loss = _loss(y)
            results.append((y, tape.gradient(loss, m.trainable_variables)))
    (y, grads), (y_plain, plain_grads) = results
    assert y.dtype == tf.as_dtype(policy.compute_dtype)
    _assert_matches(config, RECOMPUTE_TOLERANCE, y, y_plain, grads, plain_grads)
