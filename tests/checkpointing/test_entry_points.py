"""monkey_patch, GradientTape, the Keras fit hook and tf.distribute give tf.gradients' results."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad._src.checkpointing import api
from tests.checkpointing.models import BUILDERS, loss_fn, max_relative_error, residual, rewritten


@pytest.mark.slow
def test_monkey_patch_replaces_and_unpatch_restores():
    original_v2, original_v1 = tf.gradients, tf.compat.v1.gradients
    model, x, y = residual()
    variables = model.trainable_variables

    @tf.function
    def reference(x, y):
        return original_v2(loss_fn(y, model(x, training=True)), variables)

    @tf.function
    def patched_step(x, y):
        return tf.gradients(loss_fn(y, model(x, training=True)), variables)

    memgrad.monkey_patch(checkpoints="memory")
    try:
        assert tf.gradients is not original_v2
        assert tf.compat.v1.gradients is not original_v1
        with rewritten():
            patched = patched_step(x, y)
        graph = patched_step.get_concrete_function(x, y).graph
        assert any("recompute" in op.name for op in graph.get_operations())
    finally:
        memgrad.unpatch()
    assert tf.gradients is original_v2 and tf.compat.v1.gradients is original_v1
    assert max_relative_error(reference(x, y), patched) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["residual", "transformer"])
def test_gradient_tape_matches_tf_gradient_tape(name):
    keras.utils.set_random_seed(0)
    model, x, y = BUILDERS[name]()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as plain_tape:
            plain_loss = loss_fn(y, model(x, training=True))
        with memgrad.GradientTape(checkpoints="memory") as tape:
            loss = loss_fn(y, model(x, training=True))
        return (plain_tape.gradient(plain_loss, model.trainable_variables),
                tape.gradient(loss, model.trainable_variables))

    with rewritten():
        reference, checkpointed = step(x, y)
    assert max_relative_error(reference, checkpointed) <= 1e-5


def test_gradient_tape_in_eager_mode_falls_back_to_tf():
    v = tf.Variable(2.0)
    with memgrad.GradientTape() as tape:
        loss = v * v
    with pytest.warns(UserWarning, match="running eagerly") if not _eager_warned() else _nothing():
        grad = tape.gradient(loss, v)
    assert float(grad) == 4.0


def _eager_warned():
    from memgrad._src.checkpointing import tape
    return bool(tape._warned_eager)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deep_chain", "residual", "subclassed"])
def test_fit_hook_trains_like_plain_fit(name):
    keras.utils.set_random_seed(1)
    plain, x, y = BUILDERS[name]()
    hooked, _, _ = BUILDERS[name]()
    hooked.set_weights(plain.get_weights())
    for model in (plain, hooked):
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn)
    memgrad.enable_checkpointing(hooked, checkpoints="memory")
    calls = []
    original = api.rewrite_gradients

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    api.rewrite_gradients = counting
    try:
        h_plain = plain.fit(x, y, epochs=2, batch_size=8, verbose=0, shuffle=False)
        with rewritten():
            h_hooked = hooked.fit(x, y, epochs=2, batch_size=8, verbose=0, shuffle=False)
    finally:
        api.rewrite_gradients = original
    assert calls, "fit did not go through memgrad's rewrite"
    np.testing.assert_allclose(h_hooked.history["loss"], h_plain.history["loss"], rtol=1e-5)
    for a, b in zip(plain.trainable_weights, hooked.trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    memgrad.disable_checkpointing(hooked)
    assert "train_step" not in vars(hooked)


def test_fit_hook_rejects_non_models():
    with pytest.raises(TypeError, match="expects a keras.Model"):
        memgrad.enable_checkpointing(keras.layers.Dense(2))
    with pytest.raises(TypeError, match="disable_checkpointing expects a keras.Model. Received: None"):
        memgrad.disable_checkpointing(None)
    with pytest.raises(TypeError, match="disable_checkpointing expects a keras.Model. Received: <Dense"):
        memgrad.disable_checkpointing(keras.layers.Dense(2))


@pytest.mark.slow
def test_mirrored_strategy_matches_one_device(mirrored_strategy):
    strategy = mirrored_strategy
    keras.utils.set_random_seed(2)
    single, x, y = residual(depth=8, width=16)
    weights = single.get_weights()
    with strategy.scope():
        mirrored, _, _ = residual(depth=8, width=16)
    mirrored.set_weights(weights)

    @tf.function
    def one_device(x, y):
        loss = loss_fn(y, single(x, training=True))
        return tf.gradients(loss, single.trainable_variables)

    @tf.function
    def distributed(x, y):
        def replica_step(x, y):
            # Each replica sees half the batch; Keras losses divide by the number of
            # replicas in a replica context, so the all-reduced sum is the full-batch mean.
            loss = loss_fn(y, mirrored(x, training=True))
            return memgrad.gradients(loss, mirrored.trainable_variables)

        halves = strategy.experimental_distribute_values_from_function(
            lambda ctx: (x[ctx.replica_id_in_sync_group * 4:][:4],
                         y[ctx.replica_id_in_sync_group * 4:][:4]))
        per_replica = strategy.run(replica_step, args=halves)
        return [tf.add_n(strategy.experimental_local_results(g)) for g in per_replica]

    reference = one_device(x, y)
    with rewritten(calls=2):  # one call per replica
        result = distributed(x, y)
    assert max_relative_error(reference, result) <= 1e-5


@pytest.mark.slow
def test_fit_hook_under_mirrored_strategy(mirrored_strategy):
    strategy = mirrored_strategy
    with strategy.scope():
        model, x, y = residual(depth=6, width=16)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn)
    memgrad.enable_checkpointing(model)
    with rewritten():
        history = model.fit(x, y, epochs=3, batch_size=8, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
