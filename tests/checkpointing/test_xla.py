"""Checkpointing under XLA (``jit_compile=True``), the path Keras's `fit` takes on a GPU.

XLA drops control dependencies and merges equal subexpressions, so before the rewrite gated
its recomputation with a data dependency, a checkpointed step compiled with XLA had the same
peak as plain XLA (MobileNetV2: 1.00x). Gradients must equal plain XLA's; peaks are asserted
as ratios to plain XLA's, measured on CPU (XLA's CPU backend allocates through the BFC
allocator the tests read).
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad.profiler.workloads import residual_chain
from tests.checkpointing.models import max_relative_error, residual, rewritten, transformer
from tests.checkpointing.test_parity import _grouped_conv_model


def _xla_pair(loss_of, variables, checkpoints="memory"):
    """An XLA-compiled step returning (plain gradients, checkpointed gradients)."""

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as plain_tape:
            plain_loss = loss_of(x)
        with memgrad.GradientTape(checkpoints=checkpoints) as tape:
            loss = loss_of(x)
        return plain_tape.gradient(plain_loss, variables), tape.gradient(loss, variables)

    return step


def _residual_chain_case():
    weights, loss_fn = residual_chain(16, 32, seed=3)
    return loss_fn, weights, tf.random.stateless_normal([64, 32], [1, 2])


def _keras_case(build, shape):
    def case():
        model = build()
        x = tf.random.stateless_normal(shape, [3, 4])
        return (lambda x: tf.reduce_sum(model(x, training=True) ** 2)), model.trainable_variables, x
    return case


CASES = {
    "residual chain": _residual_chain_case,
    "transformer": _keras_case(lambda: transformer(blocks=3, dim=16, heads=2, tokens=6)[0], [8, 6, 16]),
    "grouped conv": _keras_case(_grouped_conv_model, [4, 8, 8, 8]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_gradients_equal_plain_xla(case):
    keras.utils.set_random_seed(0)
    loss_of, variables, x = CASES[case]()
    step = _xla_pair(loss_of, variables)
    with rewritten():
        plain, checkpointed = step(x)
    assert all(g is not None for g in checkpointed)
    assert max_relative_error(plain, checkpointed) <= 1e-5


def _xla_peak(step, *args):
    return memgrad.profiler.measure(step, args, device="CPU:0").peak_bytes


def _tape_step(loss_of, variables, tape_class, **tape_kwargs):
    @tf.function(jit_compile=True)
    def step(x):
        with tape_class(**tape_kwargs) as tape:
            loss = loss_of(x)
        grads = tape.gradient(loss, variables)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    return step


@pytest.mark.memory
def test_residual_chain_saving_holds_under_xla():
    """64 layers h <- h + relu(h W), 0.5 MiB per activation: measured 0.20x of plain XLA."""
    weights, loss_fn = residual_chain(64, 128, seed=1)
    x = tf.random.stateless_normal([1024, 128], [0, 5])
    plain = _xla_peak(_tape_step(loss_fn, weights, tf.GradientTape), x)
    checkpointed = _xla_peak(_tape_step(loss_fn, weights, memgrad.GradientTape, checkpoints="memory"), x)
    print(f"residual chain under XLA: plain {plain / 2**20:.1f} MiB, memory "
          f"{checkpointed / 2**20:.1f} MiB, ratio {checkpointed / plain:.3f}")
    assert checkpointed <= 0.3 * plain


def _transformer_12(dim=64, heads=4, tokens=64):
    keras.utils.set_random_seed(0)
    layers = keras.layers
    inputs = keras.Input((tokens, dim))
    h = inputs
    for _ in range(12):
        a = layers.MultiHeadAttention(heads, dim // heads)(h, h)
        h = layers.LayerNormalization()(h + a)
        f = layers.Dense(dim)(layers.Dense(4 * dim, activation="gelu")(h))
        h = layers.LayerNormalization()(h + f)
    return keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling1D()(h)))


@pytest.mark.memory
def test_twelve_layer_transformer_saving_holds_under_xla():
    """12 blocks, 16 x 64 tokens x 64 features: measured 0.13x of plain XLA (1.00x before)."""
    model = _transformer_12()
    x = tf.random.stateless_normal([16, 64, 64], [0, 6])

    def loss_of(x):
        return tf.reduce_sum(model(x, training=True) ** 2)

    variables = model.trainable_variables
    plain = _xla_peak(_tape_step(loss_of, variables, tf.GradientTape), x)
    checkpointed = _xla_peak(_tape_step(loss_of, variables, memgrad.GradientTape, checkpoints="memory"), x)
    print(f"transformer under XLA: plain {plain / 2**20:.1f} MiB, memory "
          f"{checkpointed / 2**20:.1f} MiB, ratio {checkpointed / plain:.3f}")
    assert checkpointed <= 0.4 * plain


@pytest.mark.memory
def test_recompute_saving_holds_under_xla():
    """memgrad.recompute around each of 16 four-layer blocks: measured 0.20x of plain XLA."""
    rng = np.random.default_rng(0)
    blocks = [[tf.Variable(rng.standard_normal((128, 128)).astype("float32") * 0.05)
               for _ in range(4)] for _ in range(16)]
    weights = [w for block in blocks for w in block]

    def block(h, ws):
        for w in ws:
            h = tf.nn.relu(h @ w)
        return h

    def loss_of(block_fn):
        def loss(x):
            h = x
            for ws in blocks:
                h = h + block_fn(h, ws)
            return tf.reduce_mean(h * h)
        return loss

    x = tf.random.stateless_normal([1024, 128], [0, 7])
    plain = _xla_peak(_tape_step(loss_of(block), weights, tf.GradientTape), x)
    recomputed = _xla_peak(_tape_step(loss_of(memgrad.recompute(block)), weights, tf.GradientTape), x)
    print(f"recompute under XLA: plain {plain / 2**20:.1f} MiB, recompute "
          f"{recomputed / 2**20:.1f} MiB, ratio {recomputed / plain:.3f}")
    assert recomputed <= 0.3 * plain


def _keras_chain(depth=32, width=128):
    inputs = keras.Input((width,))
    h = inputs
    for _ in range(depth):
        h = keras.layers.Add()([h, keras.layers.Dense(width, activation="relu")(h)])
    return keras.Model(inputs, keras.layers.Dense(1)(h))


@pytest.mark.memory
@pytest.mark.parametrize("order", ["enable then compile", "compile then enable"])
def test_fit_keeps_xla_and_the_saving(order):
    """`fit` with compile(jit_compile=True), in either order: jit_compile stays True, no
    warning, two steps (one traced, one measured) equal plain XLA's (1e-5) and the peak is at most half of it."""
    keras.utils.set_random_seed(0)
    plain, hooked = _keras_chain(), _keras_chain()
    hooked.set_weights(plain.get_weights())
    start = plain.get_weights()
    x = np.random.default_rng(0).standard_normal((1024, 128)).astype("float32")
    y = np.random.default_rng(1).standard_normal((1024, 1)).astype("float32")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse", jit_compile=True)

    compile_(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # enable_checkpointing must not warn about XLA
        if order == "enable then compile":
            memgrad.enable_checkpointing(hooked)
            compile_(hooked)
        else:
            compile_(hooked)
            memgrad.enable_checkpointing(hooked)
    assert hooked.jit_compile is True

    def fit(model):
        model.fit(x, y, batch_size=1024, epochs=1, verbose=0, shuffle=False)

    plain_peak = memgrad.profiler.measure(fit, (plain,), device="CPU:0").peak_bytes
    with rewritten():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hooked_peak = memgrad.profiler.measure(fit, (hooked,), device="CPU:0").peak_bytes
    assert not [w for w in caught if "memgrad" in str(w.message) or "XLA" in str(w.message)]
    assert hooked.jit_compile is True
    plain_steps = [s - w for s, w in zip(start, plain.get_weights())]
    hooked_steps = [s - w for s, w in zip(start, hooked.get_weights())]
    assert max_relative_error(plain_steps, hooked_steps) <= 1e-5
    print(f"fit under XLA ({order}): plain {plain_peak / 2**20:.1f} MiB, checkpointed "
          f"{hooked_peak / 2**20:.1f} MiB")
    assert hooked_peak <= 0.5 * plain_peak
