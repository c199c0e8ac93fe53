"""Memory-efficient DenseNet-BC (Huang et al. 2017; Pleiss et al. 2017).

In a dense block every layer reads the concatenation of all earlier feature maps. A plain
implementation stores, for every layer, that concatenation and its normalised, rectified copy
for the backward pass: feature-map memory grows quadratically with depth. Here each layer's
``concat -> BatchNorm -> ReLU -> 1x1 conv`` bottleneck runs under one custom gradient that keeps
only its inputs (the earlier layers' outputs, stored once anyway) and recomputes the rest in
the backward pass, so memory grows linearly. BatchNorm's moving statistics are updated once,
in the forward pass; the recomputation uses the same batch statistics and updates nothing.

Configurations of Huang et al. (Table 2): DenseNet-BC (k=12) depth 100 has 0.8M parameters,
(k=24) depth 250 15.3M, (k=40) depth 190 25.6M. Depth is ``6n + 4`` (n layers per block).
Run ``python -m memgrad_zoo.densenet --help`` to train one on the bundled digits.
"""

from __future__ import annotations

import keras
import memgrad
import tensorflow as tf

from memgrad_zoo.layers import PACKAGE, conv_factory

PAPER = {
    # (depth, growth rate): parameters in Huang et al., Table 2 (CIFAR-10)
    (100, 12): 0.8e6,
    (250, 24): 15.3e6,
    (190, 40): 25.6e6,
}


@keras.saving.register_keras_serializable(package=PACKAGE)
class EfficientBottleneck(keras.layers.Layer):
    """``conv1x1(relu(batchnorm(concat(features))))``, recomputed in the backward pass.

    Keeps none of the concatenation, normalisation or activation for backprop: the
    backward pass rebuilds them from ``features`` (Pleiss et al. 2017) with
    `memgrad.recompute`. Gradients equal plain autodiff of the same computation.

    Args:
      filters: output channels of the 1x1 convolution (4 x growth rate in DenseNet-BC).
      weight_decay: L2 factor on the kernel.
      momentum: BatchNormalization momentum of the moving statistics.
      epsilon: BatchNormalization epsilon.
      recompute: ``False`` runs the same layers under plain autodiff (for comparison).
      **kwargs: Keras layer arguments.

    Returns (when called on a list of ``[batch, H, W, C_i]`` tensors):
      ``[batch, H, W, filters]``.

    Example:
      >>> layer = EfficientBottleneck(48)
      >>> layer([tf.ones([2, 8, 8, 24]), tf.ones([2, 8, 8, 12])]).shape
      TensorShape([2, 8, 8, 48])
    """

    def __init__(self, filters, weight_decay=1e-4, momentum=0.99, epsilon=1e-3, recompute=True,
                 **kwargs):
        super().__init__(**kwargs)
        self.filters = int(filters)
        self.weight_decay = float(weight_decay)
        self.momentum, self.epsilon = float(momentum), float(epsilon)
        self.recompute = bool(recompute)
        self.norm = keras.layers.BatchNormalization(momentum=self.momentum, epsilon=self.epsilon,
                                                    name="norm")
        self.conv = conv_factory(self.weight_decay)(self.filters, 1, name="conv")
        # BN, ReLU and a convolution draw no random numbers: no need for the randomness check.
        self._recomputed = memgrad.recompute(self._forward, check_randomness=False)

    def _channels(self, input_shape):
        shapes = [input_shape] if not isinstance(input_shape, (list, tuple)) or (
            input_shape and not isinstance(input_shape[0], (list, tuple))) else list(input_shape)
        if any(len(s) != 4 or s[-1] is None for s in shapes):
            raise ValueError(
                f"EfficientBottleneck '{self.name}' takes a list of [batch, height, width, "
                f"channels] feature maps with known channels. Received shapes: {shapes}"
            )
        return shapes, sum(int(s[-1]) for s in shapes)

    def build(self, input_shape):
        shapes, channels = self._channels(input_shape)
        joined = tuple(shapes[0][:-1]) + (channels,)
        self.norm.build(joined)
        self.conv.build(joined)
        super().build(input_shape)

    def compute_output_shape(self, input_shape):
        shapes, _ = self._channels(input_shape)
        return tuple(shapes[0][:-1]) + (self.filters,)

    def _forward(self, features, training):
        joined = features[0] if len(features) == 1 else tf.concat(features, axis=-1)
        return self.conv(tf.nn.relu(self.norm(joined, training=training)))

    def call(self, features, training=None):
        features = list(features) if isinstance(features, (list, tuple)) else [features]
        if not self.recompute:
            return self._forward(features, training)
        # Keeps only ``features``; BatchNorm's moving statistics are updated once (forward pass),
        # the recomputation sees the same batch statistics and its updates are discarded.
        return self._recomputed(features, training)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "weight_decay": self.weight_decay,
                "momentum": self.momentum, "epsilon": self.epsilon, "recompute": self.recompute}


def densenet_bc(depth=100, growth_rate=12, efficient=True, num_classes=10,
                input_shape=(32, 32, 3), compression=0.5, weight_decay=1e-4, name=None):
    """DenseNet-BC for small images, with the memory-efficient bottleneck by default.

    Three dense blocks of ``n = (depth - 4) / 6`` layers (BN-ReLU-1x1 conv to 4k channels,
    BN-ReLU-3x3 conv to k channels), a 2k-channel stem, transitions that halve the channels
    (``compression``) and the resolution, and a BN-ReLU-pool-dense head.

    Args:
      depth: ``6n + 4`` (100 for the paper's 0.8M-parameter k=12 model).
      growth_rate: k, the channels each layer adds.
      efficient: recompute each bottleneck's concat-BN-ReLU in the backward pass (linear
        memory); ``False`` builds the same model with plain autodiff (quadratic memory).
      num_classes: classifier outputs (logits).
      input_shape: ``(height, width, channels)``.
      compression: the transitions' channel factor (θ).
      weight_decay: L2 factor on kernels.
      name: model name (default ``densenet-bc-<depth>-k<growth_rate>``).

    Returns:
      An uncompiled ``keras.Model`` mapping images to logits. Weights of the efficient and
      plain models correspond one to one (same layer order and names).

    Example:
      >>> model = densenet_bc(40, 12, input_shape=(8, 8, 1))
      >>> model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 10 or (depth - 4) % 6:
        raise ValueError(f"DenseNet-BC depth must be 6n + 4 with n >= 1. Received: {depth!r}")
    if not isinstance(growth_rate, int) or growth_rate < 1:
        raise ValueError(f"growth_rate must be a positive int. Received: {growth_rate!r}")
    if not 0.0 < compression <= 1.0:
        raise ValueError(f"compression must be in (0, 1]. Received: {compression!r}")
    layers_per_block = (depth - 4) // 6
    conv = conv_factory(weight_decay)
    inputs = keras.Input(input_shape)
    h = conv(2 * growth_rate, 3, name="stem")(inputs)
    channels = 2 * growth_rate
    for block in range(3):
        features = [h]
        for layer in range(layers_per_block):
            prefix = f"block{block + 1}_layer{layer + 1}"
            b = EfficientBottleneck(4 * growth_rate, weight_decay, recompute=efficient,
                                    name=f"{prefix}_bottleneck")(features)
            b = keras.layers.BatchNormalization(name=f"{prefix}_bn")(b)
            b = keras.layers.ReLU(name=f"{prefix}_relu")(b)
            features.append(conv(growth_rate, 3, name=f"{prefix}_conv")(b))
        channels += layers_per_block * growth_rate
        h = keras.layers.Concatenate(name=f"block{block + 1}_concat")(features)
        h = keras.layers.BatchNormalization(name=f"block{block + 1}_bn")(h)
        h = keras.layers.ReLU(name=f"block{block + 1}_relu")(h)
        if block < 2:
            channels = int(channels * compression)
            h = conv(channels, 1, name=f"transition{block + 1}_conv")(h)
            h = keras.layers.AveragePooling2D(2, name=f"transition{block + 1}_pool")(h)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    outputs = keras.layers.Dense(
        num_classes, kernel_regularizer=keras.regularizers.L2(weight_decay) if weight_decay else None,
        name="logits",
    )(h)
    return keras.Model(inputs, outputs, name=name or f"densenet-bc-{depth}-k{growth_rate}")
