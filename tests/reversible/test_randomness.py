"""Randomness inside a block: replayed when it can be, a clear error when it cannot.

The backward pass recomputes each block, so a random draw must come out the same the
second time. Keras seed generators owned by the block's layers are replayed; stateful TF
random ops and Keras's global seed generator are not, and would give wrong gradients.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import AdditiveCoupling, ReversibleSequence
from memgrad._src.reversible import sequence as sequence_module
from tests.reversible.stacks import dense, gradients, max_relative_error, plain_forward


class Noisy(keras.layers.Layer):
    """A Dense layer whose output is multiplied by noise drawn the way ``kind`` says."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        self.dense = dense(4, 3)
        if kind == "keras.random with an owned SeedGenerator":
            self.seed_generator = keras.random.SeedGenerator(7)
        if kind == "keras.layers.Dropout":
            self.dropout = keras.layers.Dropout(0.5)  # unseeded: a SeedGenerator of its own
        if kind == "tf.random.Generator":
            self.generator = tf.random.Generator.from_seed(3)

    def build(self, input_shape):
        self.dense.build(input_shape)

    def call(self, x, training=None):
        h = self.dense(x)
        shape = tf.shape(h)
        noise = {
            "tf.random.uniform": lambda: tf.random.uniform(shape),
            "tf.nn.dropout": lambda: tf.nn.dropout(tf.ones(shape), 0.5),
            "tf.random.Generator": lambda: self.generator.normal(shape),
            "keras.random unseeded": lambda: keras.random.normal(shape),
            "keras.random with an owned SeedGenerator": lambda: keras.random.normal(shape, seed=self.seed_generator),
            "keras.layers.Dropout": lambda: self.dropout(tf.ones(shape), training=training),
            "tf.random.stateless_normal": lambda: tf.random.stateless_normal(shape, seed=[1, 2]),
        }[self.kind]()
        return h * noise


def _stack(kind):
    return ReversibleSequence([AdditiveCoupling(Noisy(kind), dense(4, 4), name="noisy_block")], return_logdet=True)


X = tf.random.stateless_normal([4, 8], seed=[1, 2])


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("kind, op", [
    ("tf.random.uniform", "RandomUniform"),
    ("tf.nn.dropout", "RandomUniform"),
    ("tf.random.Generator", "RngReadAndSkip"),
])
def test_stateful_random_op_in_a_block_raises(kind, op, graph):
    # Unchecked, these gave gradients 46% to 400% off plain autodiff of the same forward.
    stack = _stack(kind)
    step = lambda x: gradients(lambda t: stack(t, training=True), x, stack.trainable_variables)  # noqa: E731
    with pytest.raises(ValueError, match=rf"AdditiveCoupling 'noisy_block' \(block 0 of ReversibleSequence '[^']*'\).*stateful random op.*"
                                         rf"stateless.*SeedGenerator.*Received: {op} op '[^']*'"):
        (tf.function(step) if graph else step)(X)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_unseeded_keras_random_in_a_block_raises(graph):
    # keras.random.* without a seed advances Keras's global SeedGenerator, which the block does
    # not own, so the recomputation would draw from the advanced state.
    stack = _stack("keras.random unseeded")
    step = lambda x: gradients(lambda t: stack(t, training=True), x, stack.trainable_variables)  # noqa: E731
    with pytest.raises(ValueError, match=r"AdditiveCoupling 'noisy_block' \(block 0 of ReversibleSequence '[^']*'\).*global SeedGenerator.*"
                                         r"Received: reads and assigns '[^']*seed_generator_state'"):
        (tf.function(step) if graph else step)(X)


def test_random_block_without_a_gradient_runs():
    """Only the gradient would be wrong: a forward pass with no tape watching is not refused."""
    stack = _stack("tf.random.uniform")
    assert stack(X, training=True)[0].shape == X.shape
    with pytest.raises(ValueError, match="RandomUniform"):
        gradients(stack, X, stack.trainable_variables)


def _seed_states(stack):
    return [(v, v.numpy().copy()) for v in stack.non_trainable_variables]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
@pytest.mark.parametrize("kind", ["keras.random with an owned SeedGenerator", "keras.layers.Dropout",
                                  "tf.random.stateless_normal"])
def test_replayable_randomness_matches_autodiff(kind, graph):
    stack = _stack(kind)
    stack.build(X.shape)
    reversible = lambda x: gradients(lambda t: stack(t, training=True), x, stack.trainable_variables)  # noqa: E731
    plain = lambda x: gradients(lambda t: plain_forward(stack.blocks, t, training=True, dtype=stack.invertible_dtype), x,  # noqa: E731
                                stack.trainable_variables)
    if graph:
        reversible, plain = tf.function(reversible), tf.function(plain)
    for _ in range(2):  # the second step draws from advanced seed states
        states = _seed_states(stack)
        got = reversible(X)
        for variable, value in states:  # rewind, so plain autodiff draws the same noise
            variable.assign(value)
        want = plain(X)
        assert max_relative_error([g.numpy() for g in got], [w.numpy() for w in want]) <= 1e-5
    if kind != "tf.random.stateless_normal":  # the noise did change between steps
        assert any(not np.array_equal(v.numpy(), value) for v, value in states)


@pytest.mark.slow
def test_check_traces_each_block_once_per_training_mode(monkeypatch):
    """The check is a trace per block, so it must not run again on every step."""
    checked = []
    original = sequence_module.check_replayable
    monkeypatch.setattr(sequence_module, "check_replayable",
                        lambda stack, index, *args: checked.append(index) or original(stack, index, *args))
    stack = ReversibleSequence([AdditiveCoupling(dense(4, 1), dense(4, 2)) for _ in range(2)])
    for _ in range(2):
        gradients(lambda t: (stack(t, training=True), tf.zeros([4])), X, stack.trainable_variables)
    assert checked == [0, 1]
    gradients(lambda t: (stack(t, training=False), tf.zeros([4])), X, stack.trainable_variables)
    tf.function(lambda x: gradients(lambda t: (stack(t, training=False), tf.zeros([4])), x, []))(X)
    assert checked == [0, 1, 0, 1]
