"""Glow: invertibility, exact log-density against a brute-force Jacobian, sampling, errors."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad_zoo import data
from memgrad_zoo.glow import Glow
from memgrad_zoo.train import train_glow


def perturbed_glow(image_shape, levels, steps, seed=0):
    """A Glow past its identity initialisation: ActNorm fitted to data, every weight nudged."""
    glow = Glow(image_shape, levels=levels, steps=steps, hidden=8, seed=seed)
    glow.build()
    glow(tf.random.stateless_uniform((16,) + image_shape, seed=[seed, 1]))  # ActNorm init
    rng = np.random.default_rng(seed)
    for variable in glow.trainable_variables:
        value = variable.numpy()
        variable.assign(value + 0.1 * rng.standard_normal(value.shape).astype(value.dtype))
    return glow


@pytest.mark.slow
def test_encode_then_decode_reconstructs_the_input():
    glow = perturbed_glow((8, 8, 1), levels=2, steps=4)
    u = glow.dequantize(tf.random.stateless_uniform([6, 8, 8, 1], seed=[2, 3]))
    zs, _ = glow.encode(u)
    assert [tuple(z.shape) for z in zs] == [(6, 4, 4, 2), (6, 2, 2, 8)]
    error = float(tf.reduce_max(tf.abs(glow.decode(zs) - u)))
    assert error <= 1e-4, f"x -> z -> x error {error}"


@pytest.mark.slow
def test_log_density_is_the_priors_plus_the_brute_force_jacobian_log_determinant():
    glow = perturbed_glow((4, 4, 1), levels=2, steps=2, seed=3)
    u = glow.dequantize(tf.random.stateless_uniform([3, 4, 4, 1], seed=[4, 5]))
    flat_u = tf.reshape(u, [3, -1])

    def latents(flat):
        zs, _ = glow.encode(tf.reshape(flat, [-1, 4, 4, 1]))
        return tf.concat([tf.reshape(z, [tf.shape(z)[0], -1]) for z in zs], axis=1)

    with tf.GradientTape() as tape:
        tape.watch(flat_u)
        flat_z = latents(flat_u)
    jacobian = tape.batch_jacobian(flat_z, flat_u)
    assert jacobian.shape == (3, 16, 16)
    brute_force_logdet = tf.linalg.slogdet(tf.cast(jacobian, tf.float64))[1].numpy()

    zs, log_density = glow.encode(u)
    # The priors, evaluated by hand: the factored-out half's is conditioned on the kept half,
    # which is level 1's input, i.e. the inverse of the top latent.
    kept = glow.flows[1].inverse(zs[1])
    loc, scale = glow._prior(0, kept)
    top_loc, top_scale = glow._prior(1, None)

    def normal_log_prob(z, loc, scale):
        return tf.reduce_sum(-0.5 * ((z - loc) / scale) ** 2 - tf.math.log(scale)
                             - 0.5 * math.log(2 * math.pi), axis=[1, 2, 3])

    priors = normal_log_prob(zs[0], loc, scale) + normal_log_prob(zs[1], top_loc, top_scale)
    assert np.all(np.abs(brute_force_logdet) > 0.1), "the flow should not be volume-preserving here"
    np.testing.assert_allclose(log_density.numpy() - priors.numpy(), brute_force_logdet,
                               rtol=1e-4, atol=1e-3)


@pytest.mark.slow
def test_bits_per_dim_is_the_negative_log_prob_in_bits():
    glow = perturbed_glow((8, 8, 1), levels=1, steps=2)
    x = tf.random.stateless_uniform([4, 8, 8, 1], seed=[7, 8])
    generator_state = glow.noise.state.numpy()
    log_prob = glow.log_prob(x)
    glow.noise.state.assign(generator_state)  # the same dequantisation noise
    bits = glow.bits_per_dim(x)
    np.testing.assert_allclose(bits.numpy(), -log_prob.numpy() / (64 * math.log(2)), rtol=1e-5)


@pytest.mark.slow
def test_samples_have_the_image_shape_and_range_and_follow_the_seed():
    glow = perturbed_glow((8, 8, 1), levels=2, steps=2)
    samples = glow.sample(5, temperature=0.7, seed=11)
    assert samples.shape == (5, 8, 8, 1)
    assert float(tf.reduce_min(samples)) >= 0.0 and float(tf.reduce_max(samples)) <= 1.0
    np.testing.assert_array_equal(samples.numpy(), glow.sample(5, temperature=0.7, seed=11).numpy())
    assert not np.array_equal(samples.numpy(), glow.sample(5, temperature=0.7, seed=12).numpy())
    # Temperature 0 draws every latent at its prior's mean: one deterministic image.
    cold = glow.sample(3, temperature=0.0, seed=1).numpy()
    np.testing.assert_allclose(cold, np.broadcast_to(cold[:1], cold.shape), atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(image_shape=(8, 8, 1), levels=4), "multiples of 16"),
    (dict(image_shape=(8, 8)), "(height, width, channels)"),
    (dict(steps=0), "steps must be a positive int. Received: 0"),
    (dict(n_bins=1), "n_bins must be >= 2. Received: 1"),
    (dict(levels=1.5), "levels must be a positive int. Received: 1.5"),
])
def test_bad_configurations_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Glow(**kwargs)


def test_images_of_the_wrong_shape_are_named():
    glow = Glow((8, 8, 1), levels=1, steps=1, hidden=4)
    with pytest.raises(ValueError, match=r"expects images shaped \[batch, 8, 8, 1\]. Received: \(2, 8, 8, 3\)"):
        glow.log_prob(tf.zeros([2, 8, 8, 3]))
    with pytest.raises(ValueError, match="needs 1 latents. Received: 2"):
        glow.decode([tf.zeros([1, 4, 4, 4])] * 2)


@pytest.mark.slow
def test_constant_memory_training_matches_plain_backprop_on_digits():
    """The issue's Table 1 check, small: same Glow, same data, both gradient paths."""
    digits = data.load_digits()
    results = {}
    for reversible in (True, False):
        keras.utils.set_random_seed(0)
        glow = Glow((8, 8, 1), levels=2, steps=2, hidden=16, reversible=reversible, seed=0)
        results[reversible] = train_glow(glow, digits, epochs=2, batch_size=64, lr=3e-3, verbose=0)
    reversible, plain = results[True]["test_bits_per_dim"], results[False]["test_bits_per_dim"]
    assert abs(reversible - plain) <= 0.02, (reversible, plain)
    # And it learned something: a uniform model of 17 levels costs log2(17) = 4.09 bits/dim.
    assert reversible < 0.95 * math.log2(17), reversible
