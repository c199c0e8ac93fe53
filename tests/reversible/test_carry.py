"""What the stack carries between blocks: channel halves through consecutive couplings (no
join and split per block) and the activations' gradients in the compute dtype.

Structural checks on the traced backward pass (deterministic, no memory measured) and
gradients against plain autodiff of the same forward computation; the memory they save is
measured in test_memory.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad._src.reversible import carry
from memgrad.layers import AdditiveCoupling, ReversibleBlock, ReversibleSequence
from tests.reversible.stacks import dense, gradients, make_blocks, max_relative_error, plain_forward

WIDTH = 8


def _traced_ops(stack, x):
    """The ops of the stack's gradient, traced."""
    @tf.function
    def step(x):
        return gradients(stack, x, stack.trainable_variables)

    graph = step.get_concrete_function(x).graph
    return graph.get_operations()


@pytest.mark.parametrize("kind", ["additive", "affine"])
def test_consecutive_couplings_pass_halves_without_joining_them(kind):
    """Joining the halves and splitting them again at every block boundary cost four half-sized
    copies of the activation and of its gradient, alive together in the backward pass. The
    number of joins and channel slices must not grow with depth."""
    counts = {}
    for depth in (2, 8):
        stack = ReversibleSequence(make_blocks(kind, depth, WIDTH), return_logdet=True)
        x = tf.random.stateless_normal([4, WIDTH], seed=[1, depth])
        stack(x)
        ops = _traced_ops(stack, x)
        # Joins and channel slices of activations and their gradients ([batch, channels]);
        # slices of shapes and the gates' one-element tokens are not copies of them.
        counts[depth] = sum(op.type in ("ConcatV2", "StridedSlice") and op.outputs[0].shape.rank == 2
                            for op in ops)
        assert counts[depth] > 0  # the stack's ends
    assert counts[8] == counts[2], counts


def test_the_gradient_between_float64_activations_is_float32():
    """Only rebuilding the inputs needs float64: the networks' backward takes and gives float32
    (no float64 tensor of a network's hidden width is made in the backward pass)."""
    half, hidden = WIDTH // 2, 24
    blocks = [AdditiveCoupling(keras.Sequential([keras.layers.Dense(hidden, activation="relu"),
                                                 keras.layers.Dense(half)]),
                               keras.Sequential([keras.layers.Dense(hidden, activation="relu"),
                                                 keras.layers.Dense(half)]))
              for _ in range(3)]
    stack = ReversibleSequence(blocks, return_logdet=True)
    assert stack.invertible_dtype == "float64"
    x = tf.random.stateless_normal([4, WIDTH], seed=[2, 3])
    stack(x)
    wide = [op for op in _traced_ops(stack, x) for t in op.outputs
            if t.dtype == tf.float64 and t.shape.rank == 2 and t.shape[-1] == hidden]
    assert not wide, [op.name for op in wide]


@pytest.mark.parametrize("outer, invertible, expected", [
    ("float32", "float64", "float32"),   # the default around float32 networks
    ("float64", "float64", "float64"),   # a float64 policy
    ("float16", "float32", "float32"),   # mixed precision: widened to float32
    ("bfloat16", "float32", "float32"),
    ("float16", "float16", "float16"),   # a float16 carry: never wider than the activations
    ("float32", "float32", "float32"),
])
def test_gradient_dtype(outer, invertible, expected):
    assert carry.gradient_dtype(invertible, outer) == expected


class _DoubledAdditive(AdditiveCoupling):
    """A subclass that changes the forward pass (and its inverse): y = 2 * coupling(x)."""

    def forward(self, x, training=None):
        y, logdet = super().forward(x, training)
        return 2.0 * y, logdet + tf.cast(x.shape[-1] * np.log(2.0), x.dtype)

    def inverse(self, y, training=None):
        return super().inverse(y / 2.0, training)

    def backward(self, y, dy, dlogdet, variables, training=None):  # Algorithm 1 on its own forward
        return ReversibleBlock.backward(self, y, dy, dlogdet, variables, training)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_a_subclass_that_overrides_forward_runs_its_own_forward(graph):
    """A coupling subclass with its own forward and backward is run whole: the halves path
    would silently run the parent's forward instead."""
    blocks = [_DoubledAdditive(dense(WIDTH // 2, 10 * i), dense(WIDTH // 2, 10 * i + 1)) for i in range(3)]
    assert not carry.takes_halves(blocks[0])
    plain_coupling = AdditiveCoupling(dense(2, 0), dense(2, 1))
    assert carry.takes_halves(plain_coupling)
    plain_coupling.forward = lambda x, training=None: (x, tf.zeros(tf.shape(x)[:1]))
    assert not carry.takes_halves(plain_coupling)  # replaced on the instance: run whole
    stack = ReversibleSequence(blocks, return_logdet=True)
    x = tf.random.stateless_normal([4, WIDTH], seed=[3, 4])
    y, _ = stack(x)
    want_y, _ = plain_forward(blocks, x, dtype=stack.invertible_dtype)
    np.testing.assert_allclose(y.numpy(), want_y.numpy(), rtol=1e-6)
    step = (lambda f: tf.function(f)) if graph else (lambda f: f)
    got = step(lambda t: gradients(stack, t, stack.trainable_variables))(x)
    want = step(lambda t: gradients(lambda u: plain_forward(blocks, u, dtype=stack.invertible_dtype),
                                    t, stack.trainable_variables))(x)
    assert max_relative_error([g.numpy() for g in got], [w.numpy() for w in want]) < 1e-5


@pytest.mark.parametrize("kind", ["additive", "affine", "affine_sigmoid_network", "flow"])
def test_mixed_blocks_and_halves_match_plain_autodiff_with_a_float32_gradient_carry(kind):
    """Couplings on halves between whole-tensor blocks (ActNorm, 1x1 convolution, permutation
    in 'flow'), float64 activations and float32 gradients between blocks: against plain
    autodiff of the float64-carried forward, which carries float64 gradients."""
    stack = ReversibleSequence(make_blocks(kind, 4, WIDTH), return_logdet=True)
    x = tf.random.stateless_normal([4, WIDTH], seed=[5, 6])
    stack(x)
    stack._replay_checked.add(None)
    got = gradients(stack, x, stack.trainable_variables)
    want = gradients(lambda t: plain_forward(stack.blocks, t, dtype=stack.invertible_dtype), x,
                     stack.trainable_variables)
    assert max_relative_error([g.numpy() for g in got], [w.numpy() for w in want]) < 1e-5


def test_a_loss_that_gathers_rows_of_the_output_gets_its_gradient():
    """The output's gradient then arrives as IndexedSlices, which the halves cannot slice."""
    stack = ReversibleSequence(make_blocks("additive", 3, WIDTH))
    x = tf.random.stateless_normal([4, WIDTH], seed=[7, 8])
    stack(x)

    def loss(forward):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = tf.reduce_sum(tf.sin(tf.gather(forward(x), [0, 2])))
        return tape.gradient(value, [x] + stack.trainable_variables)

    got = loss(stack)
    want = loss(lambda t: plain_forward(stack.blocks, t, dtype=stack.invertible_dtype)[0])
    assert max_relative_error([tf.convert_to_tensor(g).numpy() for g in got],
                              [tf.convert_to_tensor(w).numpy() for w in want]) < 1e-5


@pytest.mark.parametrize("pair", [False, True], ids=["whole", "halves"])
def test_a_float64_output_is_kept_as_its_float32_rounding_and_residual(pair):
    """Half the bytes of a float64 copy; 48 of its 53 bits (about 4e-15 relative)."""
    wide = tf.random.stateless_normal([16, WIDTH], seed=[9, 10], dtype=tf.float64) * 1e3
    output = carry.halves(wide) if pair else wide
    kept, returned = carry.keep_output(output, carry.cast(output, tf.float32))
    assert returned.dtype == tf.float32 and returned.shape == wide.shape
    np.testing.assert_array_equal(returned.numpy(), tf.cast(wide, tf.float32).numpy())
    assert all(t.dtype == tf.float32 for t in tf.nest.flatten(kept.residual))
    restored = carry.whole(carry.restore_output(kept))
    assert restored.dtype == tf.float64
    error = float(tf.reduce_max(tf.abs(restored - wide)) / tf.reduce_max(tf.abs(wide)))
    assert 0 <= error <= 1e-14
    assert carry.restore_output(kept) is not carry.restore_output(kept)  # a new structure each call


def test_an_output_in_the_outer_dtype_is_kept_as_it_is():
    narrow = tf.random.stateless_normal([4, WIDTH], seed=[9, 11])
    kept, returned = carry.keep_output(narrow, narrow)
    assert kept is narrow and returned is narrow


def test_glow_steps_compile_under_xla_and_match_plain_autodiff():
    """ActNorm, 1x1 convolution (its log-determinant from a QR decomposition: XLA compiles no
    LogMatrixDeterminant), affine coupling and a permutation, under ``jit_compile=True``,
    Keras's default for ``fit`` on a GPU."""
    stack = ReversibleSequence(make_blocks("flow", 3, WIDTH), return_logdet=True)
    x = tf.random.stateless_normal([4, WIDTH], seed=[11, 12])
    stack(x)
    got = tf.function(lambda t: gradients(stack, t, stack.trainable_variables), jit_compile=True)(x)
    want = gradients(lambda t: plain_forward(stack.blocks, t, dtype=stack.invertible_dtype), x,
                     stack.trainable_variables)
    assert max_relative_error([g.numpy() for g in got], [w.numpy() for w in want]) < 1e-5
    kernel = stack.blocks[1].kernel.value
    np.testing.assert_allclose(float(stack.blocks[1].forward(tf.ones([1, WIDTH]))[1][0]),
                               float(tf.linalg.slogdet(kernel)[1]), rtol=1e-5, atol=1e-6)
