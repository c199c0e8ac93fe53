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


def _small_residual():
    return residual(depth=4, width=16)


def _step_pair(builder, hooked_first, optimizer=lambda: keras.optimizers.SGD(0.1),
               metrics=("accuracy",)):
    """A plain model and a hooked copy with the same weights, both compiled alike; the
    hook is enabled before compile (``hooked_first``) or after."""
    keras.utils.set_random_seed(3)
    plain, x, y = builder()
    hooked, _, _ = builder()
    hooked.set_weights(plain.get_weights())
    if hooked_first:
        memgrad.enable_checkpointing(hooked, checkpoints="memory")
    for model in (plain, hooked):
        model.compile(optimizer=optimizer(), loss=loss_fn, metrics=list(metrics))
    if not hooked_first:
        memgrad.enable_checkpointing(hooked, checkpoints="memory")
    return plain, hooked, x, y


@pytest.mark.parametrize("hooked_first", [True, False], ids=["enable-then-compile",
                                                             "compile-then-enable"])
def test_fit_hook_one_step_equals_plain_keras_step(hooked_first):
    plain, hooked, x, y = _step_pair(_small_residual, hooked_first)
    start = plain.get_weights()
    weights = np.linspace(0.5, 1.5, x.shape[0]).astype("float32")  # sample_weight path
    h_plain = plain.fit(x, y, sample_weight=weights, batch_size=8, epochs=1, verbose=0)
    with rewritten():
        h_hooked = hooked.fit(x, y, sample_weight=weights, batch_size=8, epochs=1, verbose=0)
    # One SGD step: each update is -rate times the gradient, so this compares gradients.
    plain_steps = [s - w for s, w in zip(start, plain.get_weights())]
    hooked_steps = [s - w for s, w in zip(start, hooked.get_weights())]
    assert max_relative_error(plain_steps, hooked_steps) <= 1e-5
    assert set(h_hooked.history) == set(h_plain.history) == {"loss", "accuracy"}
    for key in h_plain.history:
        np.testing.assert_allclose(h_hooked.history[key], h_plain.history[key], rtol=1e-5)


def test_fit_hook_scales_the_loss_like_keras_under_loss_scaling():
    # A LossScaleOptimizer scales the loss before the gradient and unscales the gradients;
    # a hook that skipped either would be off by the scale (2**15).
    plain, hooked, x, y = _step_pair(
        _small_residual, False, metrics=(),
        optimizer=lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))
    start = plain.get_weights()
    plain.fit(x, y, batch_size=8, epochs=1, verbose=0)
    with rewritten():
        hooked.fit(x, y, batch_size=8, epochs=1, verbose=0)
    plain_steps = [s - w for s, w in zip(start, plain.get_weights())]
    hooked_steps = [s - w for s, w in zip(start, hooked.get_weights())]
    assert max_relative_error(plain_steps, hooked_steps) <= 1e-5


def test_fit_hook_is_per_model():
    keras.utils.set_random_seed(4)
    hooked, x, y = BUILDERS["subclassed"]()
    other, _, _ = BUILDERS["subclassed"]()  # same class, other instance
    for model in (hooked, other):
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn)
    memgrad.enable_checkpointing(hooked)
    assert "train_step" in vars(hooked) and "train_step" not in vars(other)
    assert other.train_step.__func__ is keras.Model.train_step
    with memgrad.record_rewrites() as log:
        other.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert list(log) == [], "a model without the hook went through memgrad"
    with rewritten():
        hooked.fit(x, y, batch_size=8, epochs=1, verbose=0)


def test_disable_checkpointing_restores_keras_train_step():
    keras.utils.set_random_seed(5)
    model, x, y = residual(depth=4, width=16)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn)
    memgrad.enable_checkpointing(model)
    with rewritten():
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert memgrad.disable_checkpointing(model) is model
    assert "train_step" not in vars(model)
    assert model.train_step.__func__ is keras.Model.train_step
    with memgrad.record_rewrites() as log:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert list(log) == [], "fit still went through memgrad after disable_checkpointing"
    memgrad.disable_checkpointing(model)  # a second disable is a no-op
    assert "train_step" not in vars(model)


@pytest.mark.parametrize("hooked_first", [True, False], ids=["enable-then-compile",
                                                             "compile-then-enable"])
def test_fit_hook_traces_and_rewrites_the_first_step_once(hooked_first):
    """Adam's slots are built before Keras traces the step: made inside the trace, they
    would make TensorFlow trace it (and memgrad rewrite it) twice."""
    keras.utils.set_random_seed(6)
    model, x, y = residual(depth=4, width=16)
    if hooked_first:
        memgrad.enable_checkpointing(model)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss_fn)
    if not hooked_first:
        memgrad.enable_checkpointing(model)
    with memgrad.record_rewrites() as log:
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert len(log) == 1, [entry.mode for entry in log]
    assert model.optimizer.built
    memgrad.disable_checkpointing(model)
    assert "make_train_function" not in vars(model) and "train_step" not in vars(model)


def test_fit_hook_twice_replaces_the_strategy():
    model, x, y = residual(depth=4, width=16)
    memgrad.enable_checkpointing(model, checkpoints="memory")
    memgrad.enable_checkpointing(model, checkpoints="speed")
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn)
    with memgrad.record_rewrites() as log:
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert [entry.mode for entry in log] == ["speed"]
    memgrad.disable_checkpointing(model)
    assert "train_step" not in vars(model)


class _OwnStep(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        return super().train_step(data)


def test_fit_hook_rejects_a_model_with_its_own_train_step():
    with pytest.raises(TypeError, match=r"_OwnStep overrides it .*memgrad.GradientTape"):
        memgrad.enable_checkpointing(_OwnStep())
    model, _, _ = residual(depth=2, width=8)
    model.train_step = lambda data: {}
    with pytest.raises(TypeError, match="has its own train_step attribute"):
        memgrad.enable_checkpointing(model)


@pytest.mark.slow
def test_fit_hook_under_mirrored_strategy_equals_plain_keras(mirrored_strategy):
    keras.utils.set_random_seed(6)
    with mirrored_strategy.scope():
        plain, x, y = residual(depth=4, width=16)
        hooked, _, _ = residual(depth=4, width=16)
        hooked.set_weights(plain.get_weights())
        for model in (plain, hooked):
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn)
    memgrad.enable_checkpointing(hooked)
    start = plain.get_weights()
    h_plain = plain.fit(x, y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    with rewritten():
        h_hooked = hooked.fit(x, y, epochs=1, batch_size=8, verbose=0, shuffle=False)
    np.testing.assert_allclose(h_hooked.history["loss"], h_plain.history["loss"], rtol=1e-5)
    plain_steps = [s - w for s, w in zip(start, plain.get_weights())]
    hooked_steps = [s - w for s, w in zip(start, hooked.get_weights())]
    assert max_relative_error(plain_steps, hooked_steps) <= 1e-5
