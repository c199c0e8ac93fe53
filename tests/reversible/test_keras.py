"""Keras citizenship: config, .keras round trip, fit, mixed precision, MirroredStrategy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import (
    ActNorm,
    AdditiveCoupling,
    AffineCoupling,
    ChannelPermutation,
    Invertible1x1Conv,
    ReversibleSequence,
    Squeeze,
)
from tests.reversible.stacks import angle_degrees, dense, gradients, loss_of, make_blocks, plain_forward


def _classifier(stack, width=16, classes=3):
    model = keras.Sequential([keras.Input((width,)), stack, keras.layers.Dense(classes)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(n=256, width=16, classes=3):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, width)).astype("float32")
    y = (x[:, :classes].argmax(axis=1)).astype("int32")  # learnable labels
    return x, y


@pytest.mark.parametrize("kind", ["additive", "affine", "affine_sigmoid_network", "flow"])
def test_config_round_trip(kind):
    stack = ReversibleSequence(make_blocks(kind, 2, 16), return_logdet=True,
                               check_reconstruction=True, reconstruction_tolerance=0.01)
    clone = ReversibleSequence.from_config(stack.get_config())
    assert [type(b) for b in clone.blocks] == [type(b) for b in stack.blocks]
    assert clone.return_logdet and clone.check_reconstruction
    assert clone.reconstruction_tolerance == 0.01



def test_plain_backprop_stack_is_the_same_function_under_plain_autodiff():
    """plain_backprop=True: the same blocks and weights, differentiated by ordinary autodiff."""
    blocks = make_blocks("affine", 3, 16)
    stack = ReversibleSequence(blocks, return_logdet=True)
    plain = ReversibleSequence(blocks, return_logdet=True, plain_backprop=True)
    x = tf.random.stateless_normal([8, 16], seed=[3, 4])
    stack.build(x.shape)
    want = gradients(lambda t: plain_forward(blocks, t, dtype=plain.invertible_dtype), x, stack.trainable_variables)
    got = gradients(lambda t: plain(t), x, stack.trainable_variables)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-7)
    assert ReversibleSequence.from_config(plain.get_config()).plain_backprop
    assert not ReversibleSequence.from_config(stack.get_config()).plain_backprop

@pytest.mark.slow
def test_keras_file_round_trip(tmp_path):
    blocks = [ActNorm(), Invertible1x1Conv(seed=0), AffineCoupling(dense(8, 1), dense(8, 2, None), scale="sigmoid"),
              ChannelPermutation(), AdditiveCoupling(dense(8, 3), dense(8, 4))]
    model = _classifier(ReversibleSequence(blocks))
    x, y = _data()
    model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    path = tmp_path / "reversible.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    loaded.fit(x, y, epochs=1, batch_size=64, verbose=0)  # still trains after loading


@pytest.mark.slow
def test_image_stack_keras_file_round_trip(tmp_path):
    blocks = make_blocks("image", 2, 4)
    model = keras.Sequential([keras.Input((8, 8, 4)), ReversibleSequence(blocks), keras.layers.Flatten()])
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 4)).astype("float32")
    path = tmp_path / "image.keras"
    model.save(path)
    np.testing.assert_allclose(keras.models.load_model(path)(x), model(x), rtol=1e-5, atol=1e-6)
    assert model.output_shape == (None, 4 * 4 * 16)
    assert isinstance(model.layers[0].blocks[2], Squeeze)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["additive", "affine"])
def test_model_fit_trains_every_variable(kind):
    stack = ReversibleSequence(make_blocks(kind, 4, 16))
    model = _classifier(stack)
    x, y = _data()
    before = [v.numpy().copy() for v in stack.trainable_variables]
    history = model.fit(x, y, epochs=5, batch_size=32, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0]
    changed = [not np.allclose(b, v.numpy()) for b, v in zip(before, stack.trainable_variables)]
    assert all(changed), "every variable of f and g received a gradient"


def test_functional_model_with_logdet_output():
    inputs = keras.Input((16,))
    z, logdet = ReversibleSequence(make_blocks("flow", 2, 16), return_logdet=True)(inputs)
    model = keras.Model(inputs, [z, logdet])
    out_z, out_logdet = model(np.ones((3, 16), "float32"))
    assert out_z.shape == (3, 16) and out_logdet.shape == (3,)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_mixed_precision_gradients_follow_autodiff(policy):
    keras.mixed_precision.set_global_policy(policy)
    try:
        stack = ReversibleSequence(make_blocks("flow", 2, 16), return_logdet=True)
        x = tf.random.stateless_normal([32, 16], seed=[1, 2])
        stack(x)
        got = gradients(lambda t: stack(t), x, stack.trainable_variables)
        with tf.GradientTape() as tape:
            tape.watch(x)
            with keras.src.backend.AutocastScope(stack.compute_dtype):  # as the layer's __call__ does
                y, logdet = plain_forward(stack.blocks, tf.cast(x, stack.compute_dtype),
                                          dtype=stack.invertible_dtype)
            loss = loss_of(y, logdet)
        want = tape.gradient(loss, [x] + stack.trainable_variables)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert stack.compute_dtype == ("bfloat16" if policy == "mixed_bfloat16" else "float32")
    assert all(v.dtype == "float32" for v in stack.trainable_variables)
    assert all(g is not None and g.dtype == tf.float32 for g in got[1:])
    tolerance = 1.0 if policy == "float32" else 5.0  # bfloat16 keeps ~3 significant digits
    assert angle_degrees([g.numpy() for g in got], [tf.cast(w, tf.float32).numpy() for w in want]) <= tolerance


@pytest.mark.slow
def test_mirrored_strategy_matches_one_device(mirrored_strategy):
    x, y = _data(n=64)

    def build():
        keras.utils.set_random_seed(3)
        stack = ReversibleSequence(make_blocks("affine", 3, 16))
        model = keras.Sequential([keras.Input((16,)), stack, keras.layers.Dense(3)])
        return model

    def grads_of(model, xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True)) / 64.0
        return tape.gradient(loss, model.trainable_variables)

    single = build()
    want = [g.numpy() for g in grads_of(single, x, y)]

    strategy = mirrored_strategy
    with strategy.scope():
        mirrored = build()
    for a, b in zip(mirrored.get_weights(), single.get_weights()):
        np.testing.assert_array_equal(a, b)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(64))

    @tf.function
    def distributed_grads(batch):
        per_replica = strategy.run(lambda xb, yb: grads_of(mirrored, xb, yb), args=batch)
        return [strategy.reduce("SUM", g, axis=None) for g in per_replica]

    got = [g.numpy() for g in distributed_grads(next(iter(dataset)))]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)

    with strategy.scope():
        mirrored.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = mirrored.fit(x, y, epochs=2, batch_size=32, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
