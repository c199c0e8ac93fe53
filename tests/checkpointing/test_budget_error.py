"""A BudgetError's figures are readable where users catch it: around a `tf.function` call
(autograph on, as by default) and around Keras's ``fit``."""

import keras
import pytest
import tensorflow as tf

import memgrad

BUDGET = 64  # bytes: no plan fits


def _relu_chain(weight):
    @tf.function  # autograph converts it (the default): its errors are re-raised by autograph
    def step(x):
        h = x
        for _ in range(6):
            h = tf.nn.relu(tf.matmul(h, weight))
        grads = memgrad.gradients(tf.reduce_sum(h), [weight],
                                  checkpoints=memgrad.strategies.Budget(BUDGET))
        return grads[0]

    return step


def _assert_figures(error, fraction=False):
    assert error.budget_bytes == pytest.approx(BUDGET)
    assert error.plain_bytes > 0
    assert error.smallest_feasible_bytes > BUDGET
    assert f"{error.smallest_feasible_bytes}" in str(error) or "at least" in str(error)


def test_the_figures_survive_autographs_reraise_around_a_tf_function_call():
    weight = tf.Variable(tf.random.stateless_normal([128, 128], seed=[0, 1]) * 0.1)
    step = _relu_chain(weight)
    with pytest.raises(memgrad.BudgetError) as info:
        step(tf.ones([32, 128]))
    _assert_figures(info.value)
    # The figure it names is one the same step accepts.
    accepted = memgrad.strategies.Budget(info.value.smallest_feasible_bytes)

    @tf.function
    def again(x):
        h = x
        for _ in range(6):
            h = tf.nn.relu(tf.matmul(h, weight))
        return memgrad.gradients(tf.reduce_sum(h), [weight], checkpoints=accepted)[0]

    expected = _plain(weight, tf.ones([32, 128]))
    assert float(tf.reduce_max(tf.abs(again(tf.ones([32, 128])) - expected))) <= 1e-5 * float(
        tf.reduce_max(tf.abs(expected)))


def _plain(weight, x):
    with tf.GradientTape() as tape:
        h = x
        for _ in range(6):
            h = tf.nn.relu(tf.matmul(h, weight))
        loss = tf.reduce_sum(h)
    return tape.gradient(loss, weight)


def test_the_figures_survive_around_fit():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,))] + [keras.layers.Dense(64, activation="relu")
                                                     for _ in range(4)] + [keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    memgrad.enable_checkpointing(model, memgrad.strategies.Budget(BUDGET))
    with pytest.raises(memgrad.BudgetError) as info:
        model.fit(tf.ones([16, 32]), tf.ones([16, 1]), verbose=0)
    _assert_figures(info.value)


def test_a_fractions_figures_survive_too():
    weight = tf.Variable(tf.random.stateless_normal([128, 128], seed=[0, 2]) * 0.1)

    @tf.function
    def step(x):
        h = x
        for _ in range(24):  # deep and wide enough that plans keep well under plain's peak
            h = tf.nn.relu(tf.matmul(h, weight))
        return memgrad.gradients(tf.reduce_sum(h), [weight],
                                 checkpoints=memgrad.strategies.Budget(0.01))[0]

    with pytest.raises(memgrad.BudgetError) as info:
        step(tf.ones([1024, 128]))
    print(info.value)
    assert 0.01 < info.value.smallest_feasible_fraction <= 1.0
    assert info.value.smallest_feasible_bytes > 0.01 * info.value.plain_bytes
