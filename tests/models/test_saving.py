"""Every zoo model survives a .keras round trip: same class, same configuration, same outputs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import ReversibleSequence
from memgrad_zoo import densenet, resnet, revnet
from memgrad_zoo.densenet import EfficientBottleneck
from memgrad_zoo.glow import Glow

IMAGES = tf.random.stateless_uniform([4, 8, 8, 1], seed=[9, 9])


def perturb(model, seed=0):
    """Moves every variable (BatchNorm statistics included) off its initial value."""
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        if variable.trainable or "moving" in variable.path:
            shape = tuple(variable.shape)
            variable.assign(variable.numpy() * rng.uniform(0.5, 1.5, shape).astype("float32")
                            + (0.05 * rng.uniform(0, 1, shape)).astype("float32"))


def round_trip(model, tmp_path):
    path = str(tmp_path / f"{model.name}.keras")
    model.save(path)
    return keras.saving.load_model(path)  # safe_mode: no lambdas, only registered classes


@pytest.mark.parametrize("build, layer_type", [
    (lambda: revnet.revnet(26, input_shape=(8, 8, 1)), ReversibleSequence),
    (lambda: resnet.resnet(20, input_shape=(8, 8, 1)), None),
    (lambda: densenet.densenet_bc(16, 6, efficient=True, input_shape=(8, 8, 1)), EfficientBottleneck),
    (lambda: densenet.densenet_bc(16, 6, efficient=False, input_shape=(8, 8, 1)), None),
])
@pytest.mark.slow
def test_classifiers_round_trip(tmp_path, build, layer_type):
    keras.utils.set_random_seed(0)
    model = build()
    perturb(model)
    loaded = round_trip(model, tmp_path)
    np.testing.assert_allclose(loaded(IMAGES, training=False).numpy(), model(IMAGES, training=False).numpy(),
                               rtol=1e-5, atol=1e-5)
    assert loaded.count_params() == model.count_params()
    if layer_type is not None:
        assert sum(isinstance(layer, layer_type) for layer in loaded._flatten_layers()) > 0
    if layer_type is EfficientBottleneck:
        assert all(layer.recompute for layer in loaded._flatten_layers()
                   if isinstance(layer, EfficientBottleneck))


@pytest.mark.slow
@pytest.mark.parametrize("reversible", [True, False])
def test_glow_round_trips(tmp_path, reversible):
    glow = Glow((8, 8, 1), levels=2, steps=2, hidden=8, reversible=reversible, seed=4)
    glow(IMAGES)  # ActNorm's data-dependent initialisation
    perturb(glow)
    loaded = round_trip(glow, tmp_path)
    assert isinstance(loaded, Glow) and loaded.reversible == reversible
    assert (loaded.levels, loaded.steps, loaded.hidden, loaded.n_bins) == (2, 2, 8, 17)
    u = glow.dequantize(IMAGES)
    np.testing.assert_allclose(loaded.encode(u)[1].numpy(), glow.encode(u)[1].numpy(), rtol=1e-5)
    np.testing.assert_allclose(loaded.sample(3, 0.7, seed=1).numpy(), glow.sample(3, 0.7, seed=1).numpy(),
                               atol=1e-5)


@pytest.mark.slow
def test_a_trained_glow_loads_compiled_with_its_optimizers_state(tmp_path):
    """`Glow.compile` is the model's own, so Keras's loader would skip it (the loaded model
    had no optimizer); `compile_from_config` compiles it as saved, and the saved optimizer
    variables load into it."""
    glow = Glow((8, 8, 1), levels=1, steps=1, hidden=8, seed=4)
    glow.compile(keras.optimizers.Adam(1e-3))
    glow.fit(IMAGES, batch_size=2, epochs=1, verbose=0)
    loaded = round_trip(glow, tmp_path)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert int(loaded.optimizer.iterations.numpy()) == int(glow.optimizer.iterations.numpy()) == 2
    for mine, theirs in zip(glow.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(theirs.numpy(), mine.numpy())
