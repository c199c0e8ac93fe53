"""RevNets (Gomez et al. 2017): ResNets whose units rebuild their input from their output.

`revnet(depth)` builds the paper's CIFAR configurations (Table 1):

| model | units per stage | bottleneck | channels | parameters (CIFAR-10) |
| --- | --- | --- | --- | --- |
| RevNet-38 | 3-3-3 | no | 32-32-64-112 | 0.46M |
| RevNet-110 | 9-9-9 | no | 32-32-64-128 | 1.73M |
| RevNet-164 | 9-9-9 | yes | 32-32-128-256-512 | 1.75M |

Channels are the stem's, then each stage's output (both halves together). Each stage's units
after the first run in one `memgrad.layers.ReversibleSequence` of additive couplings, so their
activations are not stored; the first unit of a stage that changes resolution or width is the
non-reversible `RevNetDownsample`. Other depths follow the rule ``depth = 12n + 2`` (basic
units: F and G have two convolutions each) or ``18n + 2`` (bottleneck), e.g. RevNet-602 is
50-50-50 basic units at the RevNet-110 widths.
Run ``python -m memgrad_zoo.revnet --help`` to train one on the bundled digits.
"""

from __future__ import annotations

import keras

from memgrad.layers import AdditiveCoupling, DriftMonitor, ReversibleSequence
from memgrad_zoo import layers as zoo_layers
from memgrad_zoo.resnet import units_per_stage

PAPER = {
    # depth: (units per stage, bottleneck, stem + stage channels, parameters in Table 1)
    38: (3, False, (32, 32, 64, 112), 0.46e6),
    110: (9, False, (32, 32, 64, 128), 1.73e6),
    164: (9, True, (32, 128, 256, 512), 1.75e6),
}
DEFAULT_CHANNELS = {False: (32, 32, 64, 128), True: (32, 128, 256, 512)}


def revnet(depth, num_classes=10, input_shape=(32, 32, 3), bottleneck=None, channels=None,
           weight_decay=1e-4, name=None, reversible=True, monitor_every=100):
    """A reversible residual network for small images.

    Args:
      depth: 38, 110, 164 (the paper's), or any ``12n + 2`` (basic) / ``18n + 2`` (bottleneck).
      num_classes: classifier outputs (logits).
      input_shape: ``(height, width, channels)``.
      bottleneck: force the unit type (default: the paper's for its depths, else basic if the
        depth fits).
      channels: ``(stem, stage1, stage2, stage3)`` widths; default the paper's.
      weight_decay: L2 factor on convolution and dense kernels (0 disables).
      name: model name (default ``revnet-<depth>``).
      reversible: train the reversible stages with constant-memory gradients; ``False`` runs
        the same network with plain backprop (`ReversibleSequence(plain_backprop=True)`).
      monitor_every: each reversible stage's `DriftMonitor` checks one training step in this
        many (per-block reconstruction drift, NaN/inf warnings; read
        ``model.get_layer("stage1_reversible").drift_monitor.errors``); 0 turns them off. The
        stages carry their activations in float64 around float32 convolutions
        (``invertible_dtype="auto"``): gradients match plain autodiff at any depth.

    Returns:
      An uncompiled ``keras.Model`` mapping images to logits.

    Example:
      >>> model = revnet(38)
      >>> model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    """
    if depth in PAPER and bottleneck is None:
        units, bottleneck, default_channels = PAPER[depth][:3]
    else:
        units, bottleneck = units_per_stage(depth, bottleneck, layers_per_unit=(4, 6), family="RevNet")
        default_channels = DEFAULT_CHANNELS[bottleneck]
    if not isinstance(monitor_every, int) or isinstance(monitor_every, bool) or monitor_every < 0:
        raise ValueError(f"RevNet monitor_every must be an int >= 0. Received: {monitor_every!r}")
    channels = tuple(channels or default_channels)
    if len(channels) != 4 or any(c % 2 for c in channels[1:]):
        raise ValueError(
            "RevNet channels are (stem, stage1, stage2, stage3) with even stage widths. "
            f"Received: {channels}"
        )
    conv = zoo_layers.conv_factory(weight_decay)
    inputs = keras.Input(input_shape)
    h = conv(channels[0], 3, name="stem")(inputs)
    width = channels[0]
    for stage, out in enumerate(channels[1:]):
        stride = 1 if stage == 0 else 2
        half = out // 2
        inner = half // 4 if bottleneck else None
        reversible_units = units
        if stride > 1 or out != width:
            h = zoo_layers.RevNetDownsample(
                out, stride, inner, weight_decay, name=f"stage{stage + 1}_downsample")(h)
            reversible_units -= 1
        width = out
        if reversible_units:
            couplings = [
                AdditiveCoupling(
                    zoo_layers.residual_function(half, inner, 1, weight_decay, name=f"F{u}"),
                    zoo_layers.residual_function(half, inner, 1, weight_decay, name=f"G{u}"),
                )
                for u in range(reversible_units)
            ]
            monitor = DriftMonitor(every=monitor_every) if monitor_every and reversible else None
            h = ReversibleSequence(couplings, plain_backprop=not reversible, drift_monitor=monitor,
                                   name=f"stage{stage + 1}_reversible")(h)
    outputs = zoo_layers.classifier_head(h, num_classes, weight_decay)
    return keras.Model(inputs, outputs, name=name or f"revnet-{depth}")
