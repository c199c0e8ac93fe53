"""Coupling blocks: RevNet's additive coupling and Glow/RealNVP's affine coupling."""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src.recompute import gate
from memgrad._src.reversible.base import (
    ReversibleBlock,
    add_gradients,
    broadcast_per_example,
    layer_name,
    network_dtype,
    network_vjp,
    per_example_sum,
    run_network,
    split_channels,
)
from memgrad._src.reversible.carry import take


def _half_shape(block, input_shape):
    channels = input_shape[-1]
    if channels is None or channels % 2:
        raise ValueError(
            f"{layer_name(block)} splits its input's last (channel) axis into two equal halves, "
            f"so it needs an even, known channel count. Received: input shape {tuple(input_shape)}"
        )
    return tuple(input_shape[:-1]) + (channels // 2,)


def _build_half_to_half(block, net, role, half_shape, out_channels=None):
    """Builds ``net`` on a half and checks that it maps a half to ``out_channels`` channels."""
    if not net.built:
        net.build(half_shape)
    expected = tuple(half_shape[:-1]) + ((out_channels or half_shape[-1]),)
    try:
        out_shape = tuple(net.compute_output_shape(half_shape))
    except NotImplementedError:
        return  # a custom layer without shape inference: checked when it runs
    if len(out_shape) != len(expected) or any(
        a is not None and b is not None and a != b for a, b in zip(out_shape, expected)
    ):
        raise ValueError(
            f"{layer_name(block)}: its {role} must keep the shape of its input half (no stride, "
            f"pooling or channel change inside a reversible block) and map {half_shape} to "
            f"{expected}. Received: {layer_name(net)} maps {half_shape} to {out_shape}"
        )


def _check_layer(block, net, role):
    if not isinstance(net, keras.layers.Layer):
        raise ValueError(
            f"{type(block).__name__}: {role} must be a Keras layer or model. Received: {net!r}"
        )


class _Coupling(ReversibleBlock):
    """A block on two channel halves. A `ReversibleSequence` hands consecutive couplings their
    halves as they are (`forward_halves`, `backward_halves`), joining them only for a block
    that takes a whole tensor; `forward` and `backward` split, call those and join."""

    accepts_invertible_dtype = True
    takes_halves = True  # a ReversibleSequence passes consecutive couplings the halves as they are

    def forward_halves(self, x1, x2, training=None):
        """`forward` on the input's two channel halves: ``(y1, y2, logdet)``."""
        raise NotImplementedError  # pragma: no cover - each coupling's own

    def backward_halves(self, y, dy, dlogdet, variables, training=None):
        """`backward` on channel halves: ``([x1, x2], [dx1, dx2], variable_gradients)``.

        Args:
          y: ``[y1, y2]``, the output's channel halves, as a list the block empties (eagerly,
            each half is then released as soon as the block no longer needs it).
          dy: ``[dy1, dy2]``, their gradients, likewise; they may be of a narrower dtype than
            ``y`` (float32 gradients of float64 activations), which the returned ones keep.
          dlogdet, variables, training: as for `backward`.

        Returns:
          ``([x1, x2], [dx1, dx2], variable_gradients)``.
        """
        raise NotImplementedError  # pragma: no cover - each coupling's own

    def forward(self, x, training=None):
        y1, y2, logdet = self.forward_halves(*split_channels(x), training=training)
        return tf.concat([y1, y2], axis=-1), logdet

    def backward(self, y, dy, dlogdet, variables, training=None):
        x, dx, grads = self.backward_halves(list(split_channels(y)), list(split_channels(dy)),
                                            dlogdet, variables, training)
        return tf.concat(list(x), axis=-1), tf.concat(list(dx), axis=-1), grads


@keras.saving.register_keras_serializable(package="memgrad")
class AdditiveCoupling(_Coupling):
    """RevNet's additive coupling block (Gomez et al. 2017).

    With the channels split in halves ``x = [x1, x2]``::

        y1 = x1 + f(x2)
        y2 = x2 + g(y1)

    Its inverse is exact up to rounding, its log-det is zero, and its backward
    rebuilds the input while back-propagating, evaluating ``f`` and ``g`` once each.

    Args:
      f: a Keras layer or model mapping a half (``C/2`` channels) to a half.
      g: likewise; a separate network with its own weights.
      **kwargs: Keras layer arguments (``name``, ``dtype``, ...).

    Example:
      >>> from memgrad.layers import ReversibleSequence
      >>> block = AdditiveCoupling(keras.layers.Dense(8, activation="relu"),
      ...                          keras.layers.Dense(8, activation="relu"))
      >>> stack = ReversibleSequence([block])
      >>> stack(tf.ones([2, 16])).shape
      TensorShape([2, 16])
    """

    def __init__(self, f, g, **kwargs):
        super().__init__(**kwargs)
        _check_layer(self, f, "f")
        _check_layer(self, g, "g")
        self.f = f
        self.g = g

    def build(self, input_shape):
        half = _half_shape(self, input_shape)
        _build_half_to_half(self, self.f, "f", half)
        _build_half_to_half(self, self.g, "g", half)
        super().build(input_shape)

    def forward_halves(self, x1, x2, training=None):
        y1 = x1 + run_network(self.f, x2, training)
        y2 = x2 + run_network(self.g, y1, training)
        return y1, y2, tf.zeros(tf.shape(x1)[:1], dtype=x1.dtype)

    def inverse(self, y, training=None):
        y1, y2 = split_channels(y)
        x2 = y2 - run_network(self.g, y1, training)
        x1 = y1 - run_network(self.f, x2, training)
        return tf.concat([x1, x2], axis=-1)

    def backward_halves(self, y, dy, dlogdet, variables, training=None):
        (y1, y2), (dy1, dy2) = take(y), take(dy)
        g_y1, g_grads = network_vjp(self.g, y1, dy2, variables, training)
        x2 = y2 - g_y1
        dz1 = dy1 + g_grads[0]  # the full gradient reaching y1
        # Eagerly, not alive through f's backward, whose hidden activations make the peak.
        del g_y1, y2, dy1
        # In a graph, f's recomputation waits for g's backward: it needs only x2, and run
        # early it would hold its hidden activations beside g's.
        f_x2, f_grads = network_vjp(self.f, gate(x2, [dz1]), dz1, variables, training)
        x1 = y1 - f_x2
        return [x1, x2], [dz1, dy2 + f_grads[0]], add_gradients(g_grads[1:], f_grads[1:])

    def get_config(self):
        config = super().get_config()
        config.update(
            f=keras.saving.serialize_keras_object(self.f),
            g=keras.saving.serialize_keras_object(self.g),
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["f"] = keras.saving.deserialize_keras_object(config["f"])
        config["g"] = keras.saving.deserialize_keras_object(config["g"])
        return cls(**config)


_SCALES = ("exp", "sigmoid")


@keras.saving.register_keras_serializable(package="memgrad")
class AffineCoupling(_Coupling):
    """Glow/RealNVP affine coupling with the fused backward of Li & Grathwohl (2019).

    With the channels split in halves ``x = [x1, x2]``::

        y1 = x1
        y2 = x2 * s + t,   log s = f(x1)              (scale="exp")
                           log s = log_sigmoid(f(x1) + 2)   (scale="sigmoid", Glow's bounded scale)
        t = g(x1)
        logdet = sum(log s)

    Give either two networks ``f`` (log-scale) and ``g`` (shift), each mapping a
    half to a half, or one ``network`` mapping a half to ``C`` channels whose first
    half is the log-scale input and second half the shift (as Glow's NN does).

    The fused backward (Algorithm 2) evaluates the networks once on ``y1 = x1``
    and uses that one evaluation both to rebuild ``x2`` and to back-propagate, so
    it costs no extra forward pass. ``fused_backward=False`` uses the generic
    invert-then-recompute path (Algorithm 1) instead, for comparison.

    Args:
      f: log-scale network (Keras layer or model), or ``None`` with ``network``.
      g: shift network, or ``None`` with ``network``.
      network: a single network giving both, or ``None``.
      scale: ``"exp"`` or ``"sigmoid"``.
      fused_backward: use Algorithm 2 (default) or Algorithm 1.
      **kwargs: Keras layer arguments.

    Example:
      >>> from memgrad.layers import ReversibleSequence
      >>> nn = keras.Sequential([keras.layers.Dense(32, activation="relu"),
      ...                        keras.layers.Dense(16, kernel_initializer="zeros")])
      >>> flow = ReversibleSequence([AffineCoupling(network=nn, scale="sigmoid")],
      ...                           return_logdet=True)
      >>> z, logdet = flow(tf.random.normal([4, 16]))
    """

    def __init__(self, f=None, g=None, network=None, scale="exp", fused_backward=True, **kwargs):
        super().__init__(**kwargs)
        if network is None and (f is None or g is None):
            raise ValueError(
                "AffineCoupling needs either both f (log-scale) and g (shift) networks, or one "
                f"`network` giving both. Received: f={f!r}, g={g!r}, network=None"
            )
        if network is not None and (f is not None or g is not None):
            raise ValueError("AffineCoupling takes f and g, or network, not both. Received all three")
        if scale not in _SCALES:
            raise ValueError(f"AffineCoupling scale must be one of {_SCALES}. Received: {scale!r}")
        for role, net in (("f", f), ("g", g), ("network", network)):
            if net is not None:
                _check_layer(self, net, role)
        self.f, self.g, self.network = f, g, network
        self.scale = scale
        self.fused_backward = bool(fused_backward)

    def build(self, input_shape):
        half = _half_shape(self, input_shape)
        if self.network is not None:
            _build_half_to_half(self, self.network, "network", half, out_channels=2 * half[-1])
        else:
            _build_half_to_half(self, self.f, "f", half)
            _build_half_to_half(self, self.g, "g", half)
        super().build(input_shape)

    def _scale_dtype(self):
        """The dtype of the log-scale and shift: the networks', at least float32."""
        networks = [self.network] if self.network is not None else [self.f, self.g]
        return "float64" if any(network_dtype(n) == "float64" for n in networks) else "float32"

    def _log_scale_and_shift(self, x1, training):
        """The log-scale and shift, from ``x1`` in `_scale_dtype` (Glow's bounded scale too).

        They stay in that dtype: a wider carried dtype is needed only for the arithmetic on
        ``x2``, which the forward and inverse do with the same scale and shift, so a backward
        pass that records them keeps nothing wider than the networks compute in.
        """
        if self.network is not None:
            raw, shift = split_channels(run_network(self.network, x1, training))
        else:
            raw, shift = run_network(self.f, x1, training), run_network(self.g, x1, training)
        if self.scale == "sigmoid":
            return tf.math.log_sigmoid(raw + 2.0), shift
        return raw, shift

    def _wide_log_scale_and_shift(self, x1, training):
        log_s, shift = self._log_scale_and_shift(tf.cast(x1, self._scale_dtype()), training)
        return tf.cast(log_s, x1.dtype), tf.cast(shift, x1.dtype)

    def forward_halves(self, x1, x2, training=None):
        log_s, shift = self._wide_log_scale_and_shift(x1, training)
        return x1, x2 * tf.exp(log_s) + shift, per_example_sum(log_s)

    def inverse(self, y, training=None):
        y1, y2 = split_channels(y)
        log_s, shift = self._wide_log_scale_and_shift(y1, training)
        return tf.concat([y1, (y2 - shift) * tf.exp(-log_s)], axis=-1)

    def backward_halves(self, y, dy, dlogdet, variables, training=None):
        (y1, y2), (dy1, dy2) = take(y), take(dy)
        if not self.fused_backward:
            x, dx, grads = ReversibleBlock.backward(
                self, tf.concat([y1, y2], axis=-1), tf.cast(tf.concat([dy1, dy2], axis=-1), y1.dtype),
                dlogdet, variables, training)
            return list(split_channels(x)), list(split_channels(tf.cast(dx, dy1.dtype))), grads
        narrow = tf.cast(y1, self._scale_dtype())
        with tf.GradientTape() as tape:
            tape.watch(narrow)
            log_s, shift = self._log_scale_and_shift(narrow, training)
        wide_log_s = tf.cast(log_s, y2.dtype)
        centred = y2 - tf.cast(shift, y2.dtype)  # = x2 * s
        del y2
        x2 = centred * tf.exp(-wide_log_s)
        # y2 = x2 * s + t: dL/dlog_s = dy2 * x2 * s (+ dlogdet), dL/dt = dy2, dL/dx2 = dy2 * s,
        # in the activations' dtype; what the networks' backward takes in theirs. Eagerly, the
        # wide temporaries are released before that backward, whose hidden activations make
        # the peak.
        wide_dy2 = tf.cast(dy2, centred.dtype)
        dlog_s = tf.cast(wide_dy2 * centred + broadcast_per_example(tf.cast(dlogdet, centred.dtype), wide_dy2),
                         log_s.dtype)
        del centred
        dx2 = tf.cast(wide_dy2 * tf.exp(wide_log_s), dy1.dtype)
        del wide_dy2, wide_log_s
        grads = tape.gradient([log_s, shift], [narrow] + list(variables),
                              output_gradients=[dlog_s, tf.cast(dy2, shift.dtype)])
        del dlog_s, narrow
        dx1 = dy1 if grads[0] is None else dy1 + tf.cast(grads[0], dy1.dtype)
        return [y1, x2], [dx1, dx2], grads[1:]

    def get_config(self):
        config = super().get_config()
        for role in ("f", "g", "network"):
            net = getattr(self, role)
            config[role] = None if net is None else keras.saving.serialize_keras_object(net)
        config.update(scale=self.scale, fused_backward=self.fused_backward)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for role in ("f", "g", "network"):
            if config.get(role) is not None:
                config[role] = keras.saving.deserialize_keras_object(config[role])
        return cls(**config)
