"""ReversibleSequence(verify_inverse=True): a block whose inverse does not undo its forward is refused."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import ReversibleBlock, ReversibleSequence
from tests.reversible.stacks import dense, make_blocks, plain_forward


class Scale(ReversibleBlock):
    """``y = 2 w x``; its inverse forgets ``w`` when ``wrong``, and counts its calls per training flag."""

    def __init__(self, wrong=False, **kwargs):
        super().__init__(**kwargs)
        self.wrong = wrong
        self.inverse_calls = []

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")
        super().build(input_shape)

    def forward(self, x, training=None):
        w = tf.cast(self.w, x.dtype)
        return 2.0 * w * x, tf.fill(tf.shape(x)[:1], tf.reduce_sum(tf.math.log(2.0 * w)))

    def inverse(self, y, training=None):
        self.inverse_calls.append(training)
        w = tf.cast(self.w, y.dtype)
        return y / 2.0 if self.wrong else y / (2.0 * w)

    def get_config(self):
        return {**super().get_config(), "wrong": self.wrong}


class WrongShift(ReversibleBlock):
    """``y = x + 1``, "inverted" as ``y - 0.5``."""

    def forward(self, x, training=None):
        return x + 1.0, tf.zeros(tf.shape(x)[:1], x.dtype)

    def inverse(self, y, training=None):
        return y - 0.5


X = tf.random.stateless_normal([4, 8], seed=[3, 4])


def _stack(last, **kwargs):
    from memgrad.layers import AdditiveCoupling
    return ReversibleSequence([AdditiveCoupling(dense(4, 1), dense(4, 2)), last], **kwargs)


def _step(stack, x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.sin(stack(x, training=True)))
    return tape.gradient(loss, stack.trainable_variables)


def test_wrong_inverse_raises_by_default_naming_the_block():
    stack = _stack(WrongShift(name="shifty"))
    assert stack.verify_inverse is True
    with pytest.raises(ValueError, match=r"WrongShift 'shifty' \(block 1 of ReversibleSequence '[^']*'\) does not "
                                         r"invert its forward pass.*relative error of 0\.\d+.*tolerance 0\.001 for "
                                         r"float32.*verify_inverse=False.*Received: relative error 0\.\d+"):
        _step(stack, X)
    with pytest.raises(ValueError, match="WrongShift 'shifty'"):  # not marked as checked: raises again
        _step(stack, X)


def test_no_check_without_a_tape():
    stack = _stack(WrongShift())
    assert stack(X).shape == X.shape  # the forward pass alone is right; only gradients would not be
    assert not stack._inverse_verified


def test_wrong_inverse_raises_in_fit():
    stack = _stack(WrongShift(name="shifty"))
    model = keras.Sequential([keras.Input((8,)), stack])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"WrongShift 'shifty'.*does not invert"):
        model.fit(X, X, epochs=1, verbose=0)


def test_wrong_inverse_raises_when_first_traced():
    stack = _stack(WrongShift(name="shifty"))
    stack.build(X.shape)
    with pytest.raises(ValueError, match=r"WrongShift 'shifty'.*does not invert"):
        tf.function(_step)(stack, X)


def test_stack_built_inside_a_trace_is_checked_in_it():
    stack = _stack(WrongShift(name="shifty"))
    with pytest.raises(ValueError, match=r"WrongShift 'shifty'.*does not invert"):
        tf.function(_step)(stack, X)


def test_unknown_dimensions_put_the_check_off_to_the_next_call():
    stack = _stack(WrongShift(name="shifty"))
    x = tf.reshape(X, [2, 2, 8])
    traced = tf.function(lambda t: _step(stack, t), input_signature=[tf.TensorSpec([None, None, 8])])
    traced(x)  # no drawn input without every non-batch dimension: put off
    assert not stack._inverse_verified
    with pytest.raises(ValueError, match=r"WrongShift 'shifty'"):
        _step(stack, x)


def test_turning_the_check_off_restores_the_old_behaviour():
    stack = _stack(WrongShift(), verify_inverse=False)
    grads = _step(stack, X)  # no error: the gradients are silently wrong, as before the check
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.sin(plain_forward(stack.blocks, X, training=True, dtype=stack.invertible_dtype)[0]))
    want = tape.gradient(loss, stack.trainable_variables)
    errors = [np.max(np.abs(g - w)) / np.max(np.abs(w)) for g, w in zip(grads, want)]
    assert max(errors) > 0.1
    assert not stack._inverse_verified


def test_a_larger_tolerance_accepts_an_approximate_inverse():
    stack = _stack(WrongShift(), verify_inverse=10.0)
    _step(stack, X)
    assert stack._inverse_verified
    with pytest.raises(ValueError, match=r"tolerance 0\.01 for"):
        _step(_stack(WrongShift(), verify_inverse=1e-2), X)


def test_the_check_runs_once():
    block = Scale()
    stack = _stack(block)
    for _ in range(3):
        _step(stack, X)
    assert block.inverse_calls.count(False) == 1  # the check's; the backward passes run with training=True
    assert block.inverse_calls.count(True) == 3
    step = tf.function(_step)
    for _ in range(3):
        step(stack, X)
    assert block.inverse_calls.count(False) == 1


def test_the_check_runs_again_after_weights_are_loaded(tmp_path):
    trained = _stack(Scale(wrong=True))
    trained.build(X.shape)
    _step(trained, X)  # w = 1: the wrong inverse happens to be right
    trained.blocks[1].w.assign(3.0 * tf.ones([8]))
    path = str(tmp_path / "stack.weights.h5")
    keras.Sequential([keras.Input((8,)), trained]).save_weights(path)

    stack = _stack(Scale(wrong=True))
    model = keras.Sequential([keras.Input((8,)), stack])
    _step(stack, X)
    assert stack._inverse_verified
    model.load_weights(path)
    assert not stack._inverse_verified
    with pytest.raises(ValueError, match=r"Scale '[^']*' \(block 1 of .*relative error of 2\b"):
        _step(stack, X)


def test_verify_inverse_is_saved_in_the_config():
    stack = _stack(WrongShift(), verify_inverse=False)
    assert stack.get_config()["verify_inverse"] is False
    assert _stack(WrongShift(), verify_inverse=0.5).get_config()["verify_inverse"] == 0.5


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "yes", None])
def test_bad_verify_inverse_is_refused(value):
    with pytest.raises(ValueError, match=rf"verify_inverse must be a positive, finite number.*Received: "
                                         rf"verify_inverse={value!r}"):
        _stack(WrongShift(), verify_inverse=value)


@pytest.mark.parametrize("kind, shape", [("additive", [4, 8]), ("affine", [4, 8]),
                                         ("affine_sigmoid_network", [4, 8]), ("algorithm1", [4, 8]),
                                         ("flow", [4, 8]), ("image", [2, 8, 8, 4]),
                                         ("image_flow", [2, 8, 8, 4])])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_correct_builtin_blocks_pass_in_every_dtype(kind, shape, dtype):
    blocks = make_blocks(kind, 2, shape[-1], dtype=dtype)
    stack = ReversibleSequence(blocks, dtype=dtype, invertible_dtype=dtype)
    _step(stack, tf.random.stateless_normal(shape, seed=[5, 6], dtype=dtype))
    assert stack._inverse_verified


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_correct_builtin_blocks_pass_under_mixed_precision(policy):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        stack = ReversibleSequence(make_blocks("flow", 2, 8))
        _step(stack, tf.random.stateless_normal([4, 8], seed=[5, 6]))
    finally:
        keras.config.set_dtype_policy(previous)
    assert stack.invertible_dtype == "float32" and stack._inverse_verified


def test_the_check_discards_every_assignment():
    """ActNorm's data initialisation and Dropout's seeds are the real forward pass's, not the check's."""
    from memgrad.layers import ActNorm, AdditiveCoupling
    checked = ReversibleSequence([ActNorm(), AdditiveCoupling(
        keras.Sequential([keras.layers.Dropout(0.5, seed=1), dense(4, 3)]), dense(4, 4))])
    unchecked = ReversibleSequence([ActNorm(), AdditiveCoupling(
        keras.Sequential([keras.layers.Dropout(0.5, seed=1), dense(4, 3)]), dense(4, 4))], verify_inverse=False)
    x = 3.0 + 2.0 * X
    _step(checked, x)
    _step(unchecked, x)
    assert checked._inverse_verified
    for a, b in zip(checked.weights, unchecked.weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class _OutputOnly(ReversibleBlock):
    """A user block that forgets the log-determinant."""

    def forward(self, x, training=None):
        return x + 1.0

    def inverse(self, y, training=None):
        return y - 1.0


@pytest.mark.parametrize("options", [dict(), dict(verify_inverse=False), dict(plain_backprop=True)])
def test_a_forward_without_its_logdet_is_a_clear_type_error(options):
    stack = ReversibleSequence([_OutputOnly(name="output_only")], **options)
    x = tf.ones([2, 4])
    with pytest.raises(TypeError, match=r"_OutputOnly 'output_only'\.forward must return "
                                        r"\(y, logdet\).*Received: EagerTensor of shape \(2, 4\)"):
        with tf.GradientTape() as tape:
            tape.watch(x)
            stack(x)
