"""Invertible flow layers for a `ReversibleSequence`: ActNorm, invertible 1x1 convolution,
channel permutation and squeeze. They take the generic backward (Algorithm 1)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from memgrad._src.reversible.base import ReversibleBlock, layer_name


def _spatial_size(x):
    """The number of positions per example sharing one channel vector (1 for a vector)."""
    dims = x.shape[1:-1]
    if all(d is not None for d in dims):
        return float(np.prod(dims)) if len(dims) else 1.0
    return tf.cast(tf.reduce_prod(tf.shape(x)[1:-1]), tf.float32)


def _per_example(value, x):
    """Broadcasts a per-batch scalar log-det to shape ``[batch]`` in ``x``'s dtype."""
    return tf.fill(tf.shape(x)[:1], tf.cast(value, x.dtype))


def _linalg_dtype(dtype):
    """float64 for float64 inputs, else float32: log-dets and inverses need at least float32."""
    return tf.float64 if dtype == tf.float64 else tf.float32


def _log_abs_det(matrix):
    """``log|det matrix|`` from a QR decomposition: ``sum(log|diag(R)|)``. Unlike
    ``tf.linalg.slogdet`` (LogMatrixDeterminant, which XLA does not compile), QR compiles
    under ``jit_compile=True`` (Keras's default for ``fit`` on a GPU) and has a gradient."""
    return tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(tf.linalg.qr(matrix)[1]))))


def _mix_channels(x, matrix):
    """``x @ matrix`` on ``x``'s last axis (any rank), as one 2-D ``MatMul``.

    Not ``tf.einsum("...i,ij->...j")``: in float16 under oneDNN on Intel CPUs with
    AVX512-FP16 (TensorFlow 2.21) that einsum is wrong (relative error above 1), while a 2-D
    MatMul is right on every CPU checked (docs/known_issues.md). A 2-D product also keeps the
    kernel's gradient one MatMul instead of a broadcast batch product summed over positions.
    """
    flat = tf.reshape(x, [-1, matrix.shape[0]])
    y = tf.reshape(tf.matmul(flat, matrix), tf.shape(x))  # a square matrix: x's shape
    y.set_shape(x.shape)
    return y


def _orthogonal(seed):
    """A random rotation, drawn in float32 and cast to the weight's dtype: the QR that draws it
    has no bfloat16 kernel, so a bfloat16 layer could not be built otherwise."""
    draw = keras.initializers.Orthogonal(seed=seed)

    def initializer(shape, dtype=None):
        return tf.cast(draw(shape, dtype="float32"), dtype or "float32")

    return initializer


def _check_channels(layer, input_shape):
    if input_shape[-1] is None:
        raise ValueError(f"{layer_name(layer)} needs a known channel count. Received: input shape {tuple(input_shape)}")
    return int(input_shape[-1])


@keras.saving.register_keras_serializable(package="memgrad")
class ActNorm(ReversibleBlock):
    """Glow's activation normalisation: ``y = (x + loc) * exp(log_scale)`` per channel.

    With ``data_init=True`` the first batch it sees sets ``loc`` and ``log_scale``
    so that its output has zero mean and unit variance per channel (Kingma &
    Dhariwal 2018). Log-det: ``sum(log_scale) * positions``.

    Args:
      data_init: initialise from the first batch (else identity at start).
      epsilon: added to the standard deviation at initialisation.
      **kwargs: Keras layer arguments.

    Example:
      >>> norm = ActNorm()
      >>> y = norm(tf.random.normal([8, 4, 4, 3]) * 5.0 + 2.0)   # ~N(0, 1) per channel
    """

    accepts_invertible_dtype = True  # its arithmetic follows its input's dtype

    def __init__(self, data_init=True, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.data_init = bool(data_init)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        channels = _check_channels(self, input_shape)
        self.loc = self.add_weight(shape=(channels,), initializer="zeros", name="loc")
        self.log_scale = self.add_weight(shape=(channels,), initializer="zeros", name="log_scale")
        self.initialized = self.add_weight(
            shape=(), initializer="zeros" if self.data_init else "ones", trainable=False,
            autocast=False, name="initialized",
        )
        super().build(input_shape)

    def replayed_state(self):
        # The backward pass must see the initialised parameters, not re-initialise them.
        return []

    def backward(self, y, dy, dlogdet, variables, training=None):
        self._recomputing = True  # read at trace time: the recomputed forward never initialises
        try:
            return super().backward(y, dy, dlogdet, variables, training)
        finally:
            self._recomputing = False

    def _initialize_if_needed(self, x):
        def initialize():
            x32 = tf.cast(x, _linalg_dtype(x.dtype))
            axes = list(range(x.shape.rank - 1))
            mean = tf.reduce_mean(x32, axis=axes)
            std = tf.math.reduce_std(x32, axis=axes)
            self.loc.assign(tf.cast(-mean, self.loc.dtype))
            self.log_scale.assign(tf.cast(-tf.math.log(std + self.epsilon), self.log_scale.dtype))
            self.initialized.assign(1.0)
            return tf.constant(True)

        if tf.executing_eagerly():
            if float(self.initialized.value) < 0.5:
                initialize()
            return None
        return tf.cond(self.initialized.value > 0.5, lambda: tf.constant(False), initialize)

    def forward(self, x, training=None):
        initializing = self.data_init and not getattr(self, "_recomputing", False)
        done = self._initialize_if_needed(x) if initializing else None
        with tf.control_dependencies([] if done is None else [done]):
            loc = tf.cast(self.loc.value, x.dtype)
            log_scale = tf.cast(self.log_scale.value, _linalg_dtype(x.dtype))
        y = (x + loc) * tf.exp(tf.cast(log_scale, x.dtype))
        return y, _per_example(tf.reduce_sum(log_scale) * _spatial_size(x), x)

    def inverse(self, y, training=None):
        loc = tf.cast(self.loc.value, y.dtype)
        return y * tf.exp(-tf.cast(self.log_scale.value, y.dtype)) - loc

    def get_config(self):
        config = super().get_config()
        config.update(data_init=self.data_init, epsilon=self.epsilon)
        return config


@keras.saving.register_keras_serializable(package="memgrad")
class Invertible1x1Conv(ReversibleBlock):
    """Glow's invertible 1x1 convolution: a learned ``C x C`` mixing of the channels.

    ``y = x @ W`` on the last axis (any rank), initialised to a random rotation;
    log-det ``log|det W| * positions``.

    Args:
      seed: seed of the random orthogonal initialisation.
      **kwargs: Keras layer arguments.

    Example:
      >>> mix = Invertible1x1Conv(seed=0)
      >>> y = mix(tf.random.normal([2, 8, 8, 4]))
    """

    accepts_invertible_dtype = True  # its arithmetic follows its input's dtype

    def __init__(self, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.seed = seed

    def build(self, input_shape):
        channels = _check_channels(self, input_shape)
        self.kernel = self.add_weight(
            shape=(channels, channels), initializer=_orthogonal(self.seed),
            name="kernel",
        )
        super().build(input_shape)

    def forward(self, x, training=None):
        kernel = tf.cast(self.kernel.value, _linalg_dtype(x.dtype))
        y = _mix_channels(x, tf.cast(kernel, x.dtype))
        return y, _per_example(_log_abs_det(kernel) * _spatial_size(x), x)

    def inverse(self, y, training=None):
        inverse_kernel = tf.linalg.inv(tf.cast(self.kernel.value, _linalg_dtype(y.dtype)))
        return _mix_channels(y, tf.cast(inverse_kernel, y.dtype))

    def get_config(self):
        config = super().get_config()
        config.update(seed=self.seed)
        return config


@keras.saving.register_keras_serializable(package="memgrad")
class ChannelPermutation(ReversibleBlock):
    """A fixed permutation of the channels (log-det 0); reverses them by default.

    Args:
      permutation: a list of channel indices, or ``None`` to reverse.
      **kwargs: Keras layer arguments.

    Example:
      >>> ChannelPermutation()(tf.constant([[1.0, 2.0, 3.0]])).numpy()
      array([[3., 2., 1.]], dtype=float32)
    """

    accepts_invertible_dtype = True  # its arithmetic follows its input's dtype

    def __init__(self, permutation=None, **kwargs):
        super().__init__(**kwargs)
        self.permutation = None if permutation is None else [int(i) for i in permutation]

    def build(self, input_shape):
        channels = _check_channels(self, input_shape)
        if self.permutation is None:
            self.permutation = list(range(channels))[::-1]
        if sorted(self.permutation) != list(range(channels)):
            raise ValueError(
                f"{layer_name(self)} needs a permutation of range({channels}). "
                f"Received: {self.permutation}"
            )
        self._inverse_permutation = list(np.argsort(self.permutation))
        super().build(input_shape)

    def forward(self, x, training=None):
        return tf.gather(x, self.permutation, axis=-1), tf.zeros(tf.shape(x)[:1], x.dtype)

    def inverse(self, y, training=None):
        return tf.gather(y, self._inverse_permutation, axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update(permutation=self.permutation)
        return config


@keras.saving.register_keras_serializable(package="memgrad")
class Squeeze(ReversibleBlock):
    """Space-to-depth: ``[B, H, W, C] -> [B, H/f, W/f, C*f*f]`` (log-det 0), as between Glow levels.

    Args:
      factor: the block size ``f``; H and W must be multiples of it.
      **kwargs: Keras layer arguments.

    Example:
      >>> Squeeze()(tf.zeros([1, 8, 8, 3])).shape
      TensorShape([1, 4, 4, 12])
    """

    accepts_invertible_dtype = True  # its arithmetic follows its input's dtype

    def __init__(self, factor=2, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(factor, int) or factor < 2:
            raise ValueError(f"Squeeze factor must be an int >= 2. Received: {factor!r}")
        self.factor = factor

    def compute_output_shape(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"{layer_name(self)} squeezes images [batch, height, width, channels]. "
                f"Received: input shape {tuple(input_shape)}"
            )
        batch, height, width, channels = input_shape
        for size in (height, width):
            if size is not None and size % self.factor:
                raise ValueError(
                    f"{layer_name(self)} needs height and width divisible by {self.factor}. "
                    f"Received: input shape {tuple(input_shape)}"
                )
        scale = lambda s: None if s is None else s // self.factor  # noqa: E731
        grow = None if channels is None else channels * self.factor**2
        return (batch, scale(height), scale(width), grow)

    def build(self, input_shape):
        self.compute_output_shape(input_shape)  # validates
        super().build(input_shape)

    def forward(self, x, training=None):
        return tf.nn.space_to_depth(x, self.factor), tf.zeros(tf.shape(x)[:1], x.dtype)

    def inverse(self, y, training=None):
        return tf.nn.depth_to_space(y, self.factor)

    def get_config(self):
        config = super().get_config()
        config.update(factor=self.factor)
        return config
