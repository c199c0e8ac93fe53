"""Layers shared by the ResNet and RevNet builders: pre-activation residual functions, the
parameter-free shortcut, RevNet's (non-reversible) downsampling unit and the classifier head."""

from __future__ import annotations

import keras
import tensorflow as tf

PACKAGE = "memgrad_models"


def conv_factory(weight_decay):
    """A function making bias-free, He-initialised convolutions with optional L2 decay."""

    def conv(filters, kernel_size, strides=1, name=None):
        return keras.layers.Conv2D(
            filters, kernel_size, strides=strides, padding="same", use_bias=False,
            kernel_initializer="he_normal",
            kernel_regularizer=keras.regularizers.L2(weight_decay) if weight_decay else None,
            name=name,
        )

    return conv


def residual_function(out_channels, inner_channels=None, stride=1, weight_decay=1e-4, name=None):
    """A pre-activation residual function: BN-ReLU-conv, twice (basic) or three times (bottleneck).

    Args:
      out_channels: channels it outputs.
      inner_channels: the bottleneck's inner width (1x1 -> 3x3 -> 1x1), or ``None`` for two 3x3
        convolutions.
      stride: stride of the first 3x3 (basic) or of the 3x3 (bottleneck).
      weight_decay: L2 factor on the kernels.
      name: the returned model's name.

    Returns:
      A ``keras.Sequential``.
    """
    conv = conv_factory(weight_decay)
    if inner_channels is None:
        plan = [(out_channels, 3, stride), (out_channels, 3, 1)]
    else:
        plan = [(inner_channels, 1, 1), (inner_channels, 3, stride), (out_channels, 1, 1)]
    stack = []
    for filters, size, strides in plan:
        stack += [keras.layers.BatchNormalization(), keras.layers.ReLU(), conv(filters, size, strides)]
    return keras.Sequential(stack, name=name)


@keras.saving.register_keras_serializable(package=PACKAGE)
class PadShortcut(keras.layers.Layer):
    """The parameter-free shortcut: subsample by ``stride``, zero-pad the channels to ``channels``.

    Args:
      channels: output channels (at least the input's).
      stride: spatial subsampling factor.
      **kwargs: Keras layer arguments.

    Example:
      >>> PadShortcut(8, stride=2)(tf.ones([1, 4, 4, 3])).shape
      TensorShape([1, 2, 2, 8])
    """

    def __init__(self, channels, stride=1, **kwargs):
        super().__init__(**kwargs)
        self.channels, self.stride = int(channels), int(stride)

    def compute_output_shape(self, input_shape):
        spatial = [None if s is None else -(-s // self.stride) for s in input_shape[1:3]]
        return (input_shape[0], *spatial, self.channels)

    def call(self, x):
        if self.stride > 1:
            x = x[:, :: self.stride, :: self.stride, :]
        extra = self.channels - x.shape[-1]
        if extra < 0:
            raise ValueError(
                f"PadShortcut '{self.name}' pads channels up to {self.channels}. "
                f"Received: {x.shape[-1]} channels"
            )
        return tf.pad(x, [[0, 0], [0, 0], [0, 0], [0, extra]]) if extra else x

    def get_config(self):
        return {**super().get_config(), "channels": self.channels, "stride": self.stride}


@keras.saving.register_keras_serializable(package=PACKAGE)
class PreActResidual(keras.layers.Layer):
    """A pre-activation residual unit: ``shortcut(x) + F(x)``.

    Args:
      width: the unit's width; it outputs ``width * expansion`` channels.
      expansion: 1 for a basic unit (two 3x3), 4 for a bottleneck unit (1x1, 3x3, 1x1).
      stride: spatial stride of the unit.
      weight_decay: L2 factor on the kernels.
      **kwargs: Keras layer arguments.

    Example:
      >>> PreActResidual(16, stride=2)(tf.ones([1, 8, 8, 16])).shape
      TensorShape([1, 4, 4, 16])
    """

    def __init__(self, width, expansion=1, stride=1, weight_decay=1e-4, **kwargs):
        super().__init__(**kwargs)
        self.width, self.expansion, self.stride = int(width), int(expansion), int(stride)
        self.weight_decay = float(weight_decay)
        out = self.width * self.expansion
        inner = self.width if self.expansion > 1 else None
        self.residual = residual_function(out, inner, self.stride, self.weight_decay, name="F")
        self.projection = None

    def build(self, input_shape):
        out = self.width * self.expansion
        if self.expansion > 1 and (self.stride > 1 or input_shape[-1] != out):
            self.projection = conv_factory(self.weight_decay)(out, 1, self.stride, name="projection")
            self.projection.build(input_shape)
        else:
            self.shortcut = PadShortcut(out, self.stride)
        self.residual.build(input_shape)
        super().build(input_shape)

    def compute_output_shape(self, input_shape):
        spatial = [None if s is None else -(-s // self.stride) for s in input_shape[1:3]]
        return (input_shape[0], *spatial, self.width * self.expansion)

    def call(self, x, training=None):
        shortcut = self.projection(x) if self.projection is not None else self.shortcut(x)
        return shortcut + self.residual(x, training=training)

    def get_config(self):
        return {**super().get_config(), "width": self.width, "expansion": self.expansion,
                "stride": self.stride, "weight_decay": self.weight_decay}


@keras.saving.register_keras_serializable(package=PACKAGE)
class RevNetDownsample(keras.layers.Layer):
    """RevNet's non-reversible unit where a stage changes resolution or width.

    The same two-half coupling as a reversible unit, but ``F`` strides and both halves pass
    through a shortcut, so the input cannot be rebuilt and this unit's activations are stored
    (Gomez et al. 2017, section 4)::

        y1 = shortcut1(x1) + F(x2)
        y2 = shortcut2(x2) + G(y1)

    The shortcuts are parameter-free (subsample, zero-pad channels) for basic units and
    strided 1x1 projections for bottleneck units, as in the matching ResNets; with these the
    parameter counts match the paper's table.

    Args:
      channels: output channels (both halves together).
      stride: spatial stride.
      inner_channels: bottleneck inner width of F and G, or ``None`` for basic functions.
      weight_decay: L2 factor on the kernels.
      **kwargs: Keras layer arguments.

    Example:
      >>> RevNetDownsample(64, stride=2)(tf.ones([1, 8, 8, 32])).shape
      TensorShape([1, 4, 4, 64])
    """

    def __init__(self, channels, stride=1, inner_channels=None, weight_decay=1e-4, **kwargs):
        super().__init__(**kwargs)
        if channels % 2:
            raise ValueError(f"RevNetDownsample needs an even channel count. Received: {channels}")
        self.channels, self.stride = int(channels), int(stride)
        self.inner_channels = None if inner_channels is None else int(inner_channels)
        self.weight_decay = float(weight_decay)
        half = self.channels // 2
        self.f = residual_function(half, self.inner_channels, self.stride, self.weight_decay, name="F")
        self.g = residual_function(half, self.inner_channels, 1, self.weight_decay, name="G")
        if self.inner_channels is None:
            self.shortcuts = [PadShortcut(half, self.stride), PadShortcut(half, self.stride)]
        else:
            conv = conv_factory(self.weight_decay)
            self.shortcuts = [conv(half, 1, self.stride, name=f"projection{i}") for i in (1, 2)]

    def build(self, input_shape):
        if input_shape[-1] is None or input_shape[-1] % 2:
            raise ValueError(
                f"RevNetDownsample '{self.name}' splits its input's channels in halves. "
                f"Received: input shape {tuple(input_shape)}"
            )
        half_in = tuple(input_shape[:-1]) + (input_shape[-1] // 2,)
        self.f.build(half_in)
        for shortcut in self.shortcuts:
            shortcut.build(half_in)
        self.g.build(tuple(self.shortcuts[0].compute_output_shape(half_in)))
        super().build(input_shape)

    def compute_output_shape(self, input_shape):
        spatial = [None if s is None else -(-s // self.stride) for s in input_shape[1:3]]
        return (input_shape[0], *spatial, self.channels)

    def call(self, x, training=None):
        x1, x2 = tf.split(x, 2, axis=-1)
        y1 = self.shortcuts[0](x1) + self.f(x2, training=training)
        y2 = self.shortcuts[1](x2) + self.g(y1, training=training)
        return tf.concat([y1, y2], axis=-1)

    def get_config(self):
        return {**super().get_config(), "channels": self.channels, "stride": self.stride,
                "inner_channels": self.inner_channels, "weight_decay": self.weight_decay}


def classifier_head(h, num_classes, weight_decay):
    """BN-ReLU, global average pooling and a dense layer giving logits."""
    h = keras.layers.BatchNormalization(name="head_bn")(h)
    h = keras.layers.ReLU(name="head_relu")(h)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    return keras.layers.Dense(
        num_classes, kernel_regularizer=keras.regularizers.L2(weight_decay) if weight_decay else None,
        name="logits",
    )(h)
