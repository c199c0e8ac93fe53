"""Multi-scale Glow (Kingma & Dhariwal 2018) trained with constant activation memory per level.

Each of the ``levels`` levels squeezes its input (space to depth) and runs ``steps`` flow
steps, ActNorm -> invertible 1x1 convolution -> affine coupling, in one
`memgrad.layers.ReversibleSequence`: the backward pass rebuilds every step's input from its
output with the fused coupling backward of Li & Grathwohl (2019), so a level's activation
memory does not grow with ``steps``. Between levels half the channels are factored out with a
learned conditional Gaussian prior (tensorflow-probability's ``Normal``); the last level has a
learned unconditional prior.

``reversible=False`` runs the very same weights with plain backprop, for comparison.
Run ``python -m memgrad_zoo.glow --help`` to train one on the bundled digits.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from memgrad.layers import ActNorm, AffineCoupling, DriftMonitor, Invertible1x1Conv, ReversibleSequence, Squeeze
from memgrad_zoo.layers import PACKAGE

tfd = tfp.distributions


def coupling_network(channels, hidden):
    """Glow's coupling NN: 3x3 conv -> ReLU -> 1x1 conv -> ReLU -> zero-initialised 3x3 conv.

    Args:
      channels: channels of the input the coupling splits (the NN maps ``channels / 2`` to
        ``channels``: log-scale and shift).
      hidden: hidden width.

    Returns:
      A ``keras.Sequential``; the zero initialisation makes every step start as the identity.
    """
    return keras.Sequential([
        keras.layers.Conv2D(hidden, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(hidden, 1, activation="relu"),
        keras.layers.Conv2D(channels, 3, padding="same", kernel_initializer="zeros"),
    ])


def _check_positive_int(name, value):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Glow {name} must be a positive int. Received: {value!r}")
    return int(value)


@keras.saving.register_keras_serializable(package=PACKAGE)
class Glow(keras.Model):
    """Multi-scale Glow for images in [0, 1] quantised to ``n_bins`` levels.

    Calling the model returns each example's bits per dimension (uniform dequantisation,
    a different draw per call), so ``compile(optimizer)`` + ``fit(x)`` trains it: its loss is
    bits/dim. Also: `log_prob`, `bits_per_dim`, `encode`, `decode` and `sample`.

    Args:
      image_shape: ``(height, width, channels)``; height and width divisible by 2**levels.
      levels: L, the number of scales.
      steps: K, flow steps per level.
      hidden: width of the coupling networks.
      n_bins: quantisation levels of the data (17 for the digits' 0..16 counts, 256 for
        8-bit images).
      reversible: train each level's steps through the constant-memory
        `ReversibleSequence` (``True``) or plain backprop (``False``); same weights either way.
      seed: seed of the weights' random parts and of the dequantisation noise.
      monitor_every: each level's `DriftMonitor` checks one training step in this many
        (per-block reconstruction drift, NaN/inf warnings; ``level.drift_monitor.errors``);
        0 turns the monitors off. Either way each level carries its activations in float64
        around float32 networks (``ReversibleSequence``'s ``invertible_dtype="auto"``), so
        reversible and plain gradients agree.
      **kwargs: Keras model arguments.

    Example:
      >>> from memgrad_zoo.data import load_digits
      >>> glow = Glow((8, 8, 1), levels=2, steps=4, hidden=32)
      >>> glow.compile(keras.optimizers.Adam(1e-3))
      >>> (x, _), _ = load_digits()
      >>> history = glow.fit(x[:128], batch_size=64, epochs=1, verbose=0)   # loss: bits/dim
      >>> glow.sample(16, temperature=0.7).shape                           # in [0, 1]
      TensorShape([16, 8, 8, 1])
    """

    def __init__(self, image_shape=(8, 8, 1), levels=2, steps=8, hidden=64, n_bins=17,
                 reversible=True, seed=0, monitor_every=100, **kwargs):
        super().__init__(**kwargs)
        self.image_shape = tuple(int(s) for s in image_shape)
        if len(self.image_shape) != 3:
            raise ValueError(f"Glow image_shape is (height, width, channels). Received: {image_shape!r}")
        self.levels = _check_positive_int("levels", levels)
        self.steps = _check_positive_int("steps", steps)
        self.hidden = _check_positive_int("hidden", hidden)
        self.n_bins = _check_positive_int("n_bins", n_bins)
        if self.n_bins < 2:
            raise ValueError(f"Glow n_bins must be >= 2. Received: {n_bins}")
        height, width, channels = self.image_shape
        factor = 2**self.levels
        if height % factor or width % factor:
            raise ValueError(
                f"Glow with {self.levels} levels squeezes by 2 per level, so height and width "
                f"must be multiples of {factor}. Received: image_shape {self.image_shape}"
            )
        self.reversible = bool(reversible)
        self.seed = int(seed)
        if not isinstance(monitor_every, (int, np.integer)) or isinstance(monitor_every, bool) or monitor_every < 0:
            raise ValueError(f"Glow monitor_every must be an int >= 0. Received: {monitor_every!r}")
        self.monitor_every = int(monitor_every)
        self.noise = keras.random.SeedGenerator(self.seed)
        self.flows, self.priors, self.level_shapes = [], [], []
        shape = (height, width, channels)
        for level in range(self.levels):
            shape = (shape[0] // 2, shape[1] // 2, shape[2] * 4)
            blocks = [Squeeze(name="squeeze")]
            for step in range(self.steps):
                blocks += [
                    ActNorm(name=f"actnorm{step}"),
                    Invertible1x1Conv(seed=self.seed * 1000 + level * 100 + step, name=f"mix{step}"),
                    AffineCoupling(network=coupling_network(shape[2], self.hidden), scale="sigmoid",
                                   name=f"coupling{step}"),
                ]
            # plain_backprop runs the very same blocks, carried in the same dtype, under autodiff.
            monitor = DriftMonitor(every=self.monitor_every) if self.monitor_every and self.reversible else None
            self.flows.append(ReversibleSequence(blocks, return_logdet=True, plain_backprop=not self.reversible,
                                                 drift_monitor=monitor, name=f"level{level}"))
            self.level_shapes.append(shape)
            if level < self.levels - 1:
                # Half the channels leave; the prior of those is predicted from the other half.
                self.priors.append(keras.layers.Conv2D(
                    shape[2], 3, padding="same", kernel_initializer="zeros", name=f"prior{level}"))
                shape = (shape[0], shape[1], shape[2] // 2)
        self.top_shape = shape

    @property
    def dimensions(self):
        """The number of dimensions per example (height x width x channels)."""
        return int(np.prod(self.image_shape))

    def build(self, input_shape=None):
        shape = (None,) + self.image_shape
        for level, flow in enumerate(self.flows):
            flow.build(shape)
            out = (None,) + self.level_shapes[level]
            if level < self.levels - 1:
                half = out[:-1] + (out[-1] // 2,)
                self.priors[level].build(half)
                shape = half
        self.top_loc = self.add_weight(shape=self.top_shape, initializer="zeros", name="top_loc")
        self.top_log_scale = self.add_weight(shape=self.top_shape, initializer="zeros",
                                             name="top_log_scale")
        super().build((None,) + self.image_shape)

    def _check_images(self, x):
        x = tf.convert_to_tensor(x, dtype=self.compute_dtype)
        if tuple(x.shape[1:]) != self.image_shape:
            raise ValueError(
                f"Glow expects images shaped [batch, {', '.join(map(str, self.image_shape))}]. "
                f"Received: {tuple(x.shape)}"
            )
        return x

    def _run_level(self, flow, h, training):
        return flow(h, training=training)  # plain_backprop=True when not reversible

    def _prior(self, level, h):
        if level < self.levels - 1:
            loc, log_scale = tf.split(self.priors[level](h), 2, axis=-1)
        else:
            loc, log_scale = self.top_loc, self.top_log_scale
        return loc, tf.exp(log_scale)

    def encode(self, u, training=None):
        """Maps dequantised data ``u`` (in [-0.5, 0.5]) to latents.

        Args:
          u: ``[batch, H, W, C]`` continuous inputs.
          training: Keras training flag.

        Returns:
          ``(zs, log_density)``: one latent per level (finest first) and the log-density of
          ``u`` in nats per example (priors plus log-determinants).
        """
        if not self.built:
            self.build()
        h, total = u, tf.zeros(tf.shape(u)[:1], u.dtype)
        zs = []
        for level, flow in enumerate(self.flows):
            h, logdet = self._run_level(flow, h, training)
            total = total + logdet
            if level < self.levels - 1:
                h, z = tf.split(h, 2, axis=-1)
            else:
                z = h
            loc, scale = self._prior(level, h)
            log_p = tfd.Normal(loc, scale).log_prob(z)
            total = total + tf.reduce_sum(log_p, axis=[1, 2, 3])
            zs.append(z)
        return zs, total

    def decode(self, zs, training=False):
        """Inverts `encode`: latents (finest first) to data in [-0.5, 0.5].

        Args:
          zs: one latent per level, as `encode` returns them.
          training: Keras training flag.

        Returns:
          ``u``, ``[batch, H, W, C]``.
        """
        if not self.built:
            self.build()
        if len(zs) != self.levels:
            raise ValueError(f"Glow.decode needs {self.levels} latents. Received: {len(zs)}")
        h = zs[-1]
        for level in reversed(range(self.levels)):
            if level < self.levels - 1:
                h = tf.concat([h, zs[level]], axis=-1)
            h = self.flows[level].inverse(h, training=training)
        return h

    def dequantize(self, x):
        """Images in [0, 1] (``n_bins`` levels) -> ``(level + uniform noise) / n_bins - 0.5``."""
        x = self._check_images(x)
        levels = tf.round(x * (self.n_bins - 1))
        noise = keras.random.uniform(tf.shape(x), seed=self.noise, dtype=x.dtype)
        return (levels + noise) / self.n_bins - 0.5

    def log_prob(self, x, training=None):
        """Log-likelihood (nats, lower bound by dequantisation) of quantised images.

        Args:
          x: images in [0, 1], ``[batch, H, W, C]``.
          training: Keras training flag.

        Returns:
          ``[batch]`` log-probabilities in nats.
        """
        _, log_density = self.encode(self.dequantize(x), training=training)
        return log_density - self.dimensions * math.log(self.n_bins)

    def bits_per_dim(self, x, training=None):
        """``-log_prob(x) / (dimensions * ln 2)`` per example."""
        return -self.log_prob(x, training=training) / (self.dimensions * math.log(2.0))

    def call(self, inputs, training=None):
        return self.bits_per_dim(inputs, training=training)

    def compile(self, *args, **kwargs):
        """Keras's `compile`, then the model's and the optimizer's variables are built.

        Glow's shapes are known from ``image_shape``, so nothing waits for data. Left to
        `fit`, Keras would create them while it traces the first training step, and
        TensorFlow traces a function that creates variables twice (the docstring's fit:
        17.2 s -> 10.3 s on a 2-core CPU). ActNorm still initializes from the first batch.
        """
        super().compile(*args, **kwargs)
        with self.distribute_strategy.scope():
            if not self.built:
                self.build()
            if self.optimizer is not None and not self.optimizer.built:
                self.optimizer.build(self.trainable_variables)

    def compile_from_config(self, config):
        """Compiles a loaded model as it was saved, optimizer state included (Keras skips
        models whose `compile` is their own)."""
        self.compile(**keras.saving.deserialize_keras_object(config))

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = tf.reduce_mean(y_pred)
        if self.losses:
            loss = loss + tf.add_n([tf.cast(l, loss.dtype) for l in self.losses])
        return loss

    def sample(self, n, temperature=1.0, seed=None):
        """Draws ``n`` images, each latent's prior scale multiplied by ``temperature``.

        Args:
          n: number of samples.
          temperature: scale factor of the priors' standard deviations (0.7 is typical).
          seed: seed of the draw (``None``: a fresh one).

        Returns:
          ``[n, H, W, C]`` images in [0, 1].
        """
        n = _check_positive_int("sample count", n)
        if not self.built:
            self.build()
        generator = tf.random.Generator.from_seed(seed) if seed is not None else tf.random.get_global_generator()
        shape = (n,) + self.top_shape
        loc, scale = self._prior(self.levels - 1, None)
        h = loc + temperature * scale * generator.normal(shape)
        for level in reversed(range(self.levels)):
            if level < self.levels - 1:
                loc, scale = self._prior(level, h)
                h = tf.concat([h, loc + temperature * scale * generator.normal(tf.shape(loc))], axis=-1)
            h = self.flows[level].inverse(h, training=False)
        return tf.clip_by_value(h + 0.5, 0.0, 1.0)

    def get_config(self):
        config = super().get_config()
        config.update(image_shape=self.image_shape, levels=self.levels, steps=self.steps,
                      hidden=self.hidden, n_bins=self.n_bins, reversible=self.reversible,
                      seed=self.seed, monitor_every=self.monitor_every)
        return config
