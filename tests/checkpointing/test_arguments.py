"""Argument validation: the errors tf.gradients, Keras and memgrad's own contracts give."""

import re

import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad._src.checkpointing.budget_planner import budget_error

W = tf.Variable(tf.ones([3, 3]))


def _traced(fn):
    """Traces ``fn`` (a tf.function) and returns what it returns, or raises what tracing raises."""
    return tf.function(fn).get_concrete_function()


def _loss():
    return tf.reduce_sum(tf.tanh(tf.ones([2, 3]) @ W))


def _tf_gradients_error(ys, xs):
    with pytest.raises(Exception) as info:
        _traced(lambda: tf.gradients(ys() if callable(ys) else ys, xs))
    return info.value


@pytest.mark.parametrize("case", ["ys=None", "xs=None", "ys=[y, None]", "xs=[W, None]"])
def test_none_ys_or_xs_raise_what_tf_gradients_raises(case):
    ys = {"ys=None": None, "ys=[y, None]": "pair"}.get(case, "loss")
    xs = {"xs=None": None, "xs=[W, None]": [W, None]}.get(case, [W])

    def call(gradients):
        def fn():
            y = {"loss": _loss, "pair": lambda: [_loss(), None]}.get(ys, lambda: None)()
            return gradients(y, xs)
        return fn

    with pytest.raises(Exception) as expected:
        _traced(call(tf.gradients))
    assert type(expected.value) is AttributeError  # TF 2.21: 'NoneType' object has no attribute 'op'
    name, index = case.split("=")[0], "[1]" if "[" in case else ""
    with pytest.raises(AttributeError, match=rf"memgrad.gradients expects {name} to be a tensor.*"
                                             rf"Received: {re.escape(name + index)}=None"):
        _traced(call(memgrad.gradients))


def test_empty_lists_stay_what_tf_gradients_gives():
    def fn():
        return tf.gradients([], [W]), memgrad.gradients([], [W]), memgrad.gradients(_loss(), [])
    expected, got, none = None, None, None

    @tf.function
    def run():
        nonlocal expected, got, none
        expected, got, none = fn()
        return 0

    run.get_concrete_function()
    assert expected == [None] and got == [None] and none == []


def test_gradients_in_eager_mode_still_names_the_graph_requirement():
    with pytest.raises(RuntimeError, match="works inside a graph"):
        memgrad.gradients(None, [W])


@pytest.mark.parametrize("checkpoints, error, received", [
    ("fastest", ValueError, r"Received: 'fastest'"),
    (3, TypeError, r"Received: int"),
])
def test_gradients_refuses_an_unknown_strategy(checkpoints, error, received):
    with pytest.raises(error, match=rf"checkpoints must be one of.*{received}"):
        _traced(lambda: memgrad.gradients(_loss(), [W], checkpoints=checkpoints))


@pytest.mark.parametrize("value, name", [(42, "int 42"), (np.ones(2), "ndarray"), (W, "ResourceVariable"),
                                         ("h", "str 'h'"), (None, "NoneType None")])
def test_checkpoint_refuses_what_is_not_a_tensor(value, name):
    with pytest.raises(TypeError, match=rf"memgrad.mark_checkpoint.*expected a tf.Tensor. Received: {re.escape(name)}"):
        memgrad.mark_checkpoint(value)


@pytest.mark.parametrize("old, new", [("checkpoint", "mark_checkpoint"), ("Rewrite", "RewriteRecord")])
def test_the_old_names_still_work_for_one_release_and_warn(old, new):
    with pytest.warns(DeprecationWarning, match=rf"memgrad.{old} is deprecated.*use memgrad.{new}"):
        assert getattr(memgrad, old) is getattr(memgrad, new)
    assert old not in memgrad.__all__ and new in memgrad.__all__
    with pytest.raises(AttributeError, match="no attribute 'checkpoints'"):
        memgrad.checkpoints


def test_checkpoint_returns_tensors_unchanged():
    t = tf.ones([2])
    assert memgrad.mark_checkpoint(t) is t

    @tf.function
    def fn():
        h = tf.tanh(tf.ones([2]))
        assert memgrad.mark_checkpoint(h) is h
        assert h in tf.compat.v1.get_default_graph().get_collection("checkpoints")
        return h

    fn.get_concrete_function()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(checkpoints="fastest"), ValueError, r"checkpoints must be one of.*Received: 'fastest'"),
    (dict(checkpoints=0.5), TypeError, r"checkpoints must be one of.*Received: float"),
    (dict(checkpoints=None), TypeError, r"Received: NoneType"),
    (dict(persistent="yes"), TypeError, r"persistent must be True or False. Received: persistent='yes'"),
    (dict(watch_accessed_variables=1), TypeError, r"watch_accessed_variables must be True or False. Received: "
                                                  r"watch_accessed_variables=1"),
])
def test_gradient_tape_validates_at_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        memgrad.GradientTape(**kwargs)


@pytest.mark.parametrize("checkpoints, error, received", [
    ("fastest", ValueError, r"Received: 'fastest'"),
    (0.5, TypeError, r"Received: float"),
])
def test_enable_checkpointing_and_monkey_patch_validate_the_strategy_at_once(checkpoints, error, received):
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(error, match=rf"checkpoints must be one of.*{received}"):
        memgrad.enable_checkpointing(model, checkpoints=checkpoints)
    assert "train_step" not in vars(model)  # left as it was
    original = tf.gradients
    with pytest.raises(error, match=rf"checkpoints must be one of.*{received}"):
        memgrad.monkey_patch(checkpoints=checkpoints)
    assert tf.gradients is original  # nothing patched


def test_gradient_tape_accepts_every_strategy_kind():
    for checkpoints in ("memory", "speed", "collection", [], memgrad.strategies.Budget(0.5),
                        memgrad.strategies.Speed()):
        assert memgrad.GradientTape(checkpoints=checkpoints).checkpoints is checkpoints


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((0,), {}, ValueError, r"Budget bytes must be positive. Received: 0"),
    ((-5,), {}, ValueError, r"Received: -5"),
    (("0MiB",), {}, ValueError, r"Budget bytes must be positive. Received: '0MiB'"),
    ((0.0,), {}, ValueError, r"fractional Budget must lie in \(0, 1\].*Received: 0.0"),
    ((1.5,), {}, ValueError, r"fractional Budget must lie in \(0, 1\].*Received: 1.5"),
    ((float("nan"),), {}, ValueError, r"Received: nan"),
    (("lots",), {}, ValueError, r"Received: 'lots'"),
    ((None,), {}, TypeError, r"Budget expects bytes.*Received: NoneType None"),
    ((True,), {}, TypeError, r"Received: bool True"),
    (("1GiB",), dict(margin=1.0), ValueError, r"margin must lie in \[0, 1\). Received: 1.0"),
    (("1GiB",), dict(margin=-0.1), ValueError, r"Received: -0.1"),
    (("1GiB",), dict(margin="10%"), TypeError, r"margin must be a number.*Received: str '10%'"),
    (("1GiB",), dict(simulate="yes"), TypeError, r"simulate must be True or False. Received: 'yes'"),
    (("1GiB",), dict(measure=1), TypeError, r"measure must be True or False. Received: 1"),
    (("1GiB",), dict(scratch=None), TypeError, r"scratch must be True or False. Received: None"),
])
def test_budget_validates_at_construction(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        memgrad.strategies.Budget(*args, **kwargs)


def test_a_budget_shows_what_it_was_given():
    assert repr(memgrad.strategies.Budget(0.5)) == "Budget(0.5)"
    assert repr(memgrad.strategies.Budget("64MiB")) == "Budget('64.00 MiB')"
    assert repr(memgrad.strategies.Budget(1024)) == "Budget('1.00 KiB')"


def test_budget_error_names_a_fraction_when_one_fits():
    error = budget_error(budget_bytes=100, smallest_feasible_bytes=450, plain_bytes=1000, margin=0.1,
                          fraction=0.1)
    assert "Expected a fraction of at least 0.45 " in str(error)
    assert error.smallest_feasible_fraction == 0.45


def test_budget_error_names_bytes_when_no_fraction_fits():
    # Even the leanest plan over plain backprop's peak (with the margin, plain/(1 - 0.1)): the
    # fraction it used to name, 1.112, is one no Budget accepts.
    error = budget_error(budget_bytes=500, smallest_feasible_bytes=1000 / 0.9, plain_bytes=1000,
                          margin=0.1, fraction=0.5, source="simulated")
    message = str(error)
    assert "fraction of at least" not in message and "1.112" not in message
    assert "Expected a budget of at least 1112 bytes" in message
    assert "plain backprop's simulated peak of 1000 bytes" in message
    assert "memgrad.strategies.Budget(1112)" in message and "Received: Budget(0.5), 500 bytes" in message
    assert error.smallest_feasible_fraction is None and error.smallest_feasible_bytes == 1112
    with pytest.raises(ValueError):  # what the old message asked for cannot be passed
        memgrad.strategies.Budget(1.112)


def test_budget_error_from_a_graph_no_plan_helps():
    """One matrix product: nothing to recompute, so no plan beats plain backprop."""
    x = tf.ones([64, 64])

    @tf.function
    def fn(x):
        return memgrad.gradients(tf.reduce_sum(x @ W2), [W2], checkpoints=memgrad.strategies.Budget(0.5))

    with pytest.raises(memgrad.BudgetError) as info:
        fn.get_concrete_function(x)
    message = str(info.value)
    assert "fraction of at least" not in message
    assert re.search(r"Expected a budget of at least \d+ bytes .*plain backprop's modelled peak of \d+ bytes.*"
                     r"give the budget in bytes.*Received: Budget\(0.5\), \d+ bytes", message)
    needed = int(re.search(r"Budget\((\d+)\)", message).group(1))

    @tf.function
    def fits(x):
        return memgrad.gradients(tf.reduce_sum(x @ W2), [W2], checkpoints=memgrad.strategies.Budget(needed))

    fits.get_concrete_function(x)  # the bytes named are accepted


W2 = tf.Variable(tf.ones([64, 64]))


def test_reversible_sequence_refuses_a_bad_reconstruction_tolerance():
    from memgrad.layers import AdditiveCoupling, ReversibleSequence
    import keras
    for value in (-1, 0, float("inf"), "small"):
        with pytest.raises(ValueError, match=rf"reconstruction_tolerance must be a positive, finite number. "
                                             rf"Received: reconstruction_tolerance={re.escape(repr(value))}"):
            ReversibleSequence([AdditiveCoupling(keras.layers.Dense(2), keras.layers.Dense(2))],
                               reconstruction_tolerance=value)


def test_the_budget_an_error_names_is_a_whole_number_of_bytes_that_fits():
    """A refusal named 222 B for a smallest peak of 222.4 B (the margin's division), and
    Budget(222) was refused in turn: the named budget is now rounded up, float noise aside."""
    error = budget_error(budget_bytes=100, smallest_feasible_bytes=177.92 / 0.8,
                          plain_bytes=1000, margin=0.2)
    assert error.smallest_feasible_bytes == 223
    assert "Expected a budget of at least 223 B" in str(error)
    exact = budget_error(budget_bytes=100, smallest_feasible_bytes=450 * (1 + 1e-12),
                          plain_bytes=1000)
    assert exact.smallest_feasible_bytes == 450
