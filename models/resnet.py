"""ResNets for CIFAR-sized images (He et al. 2016, pre-activation), the RevNet paper's baselines.

`resnet(depth)` builds the configurations of Gomez et al. (2017), Table 1:

| model | units per stage | bottleneck | channels | parameters (CIFAR-10) |
| --- | --- | --- | --- | --- |
| ResNet-32 | 5-5-5 | no | 16-16-32-64 | 0.46M |
| ResNet-110 | 18-18-18 | no | 16-16-32-64 | 1.73M |
| ResNet-164 | 18-18-18 | yes | 16-64-128-256 | 1.70M |

and any other depth by the same rule: ``depth = 6n + 2`` (basic units) or ``9n + 2`` (bottleneck).
Run ``python -m memgrad_zoo.resnet --help`` to train one on the bundled digits.
"""

from __future__ import annotations

import keras

from memgrad_zoo import layers as zoo_layers

PAPER = {
    # depth: (units per stage, bottleneck, parameters in the paper's Table 1 for CIFAR-10)
    32: (5, False, 0.46e6),
    110: (18, False, 1.73e6),
    164: (18, True, 1.70e6),
}
BASE_WIDTH = 16  # the first stage's width (inner width for bottleneck units)


def units_per_stage(depth, bottleneck=None, layers_per_unit=(2, 3), family="ResNet"):
    """The number of units per stage, and whether they are bottleneck units, for ``depth``.

    Args:
      depth: total weighted layers: the stem convolution, the units' convolutions and the
        classifier.
      bottleneck: force basic (False) or bottleneck (True) units; ``None`` picks the paper's
        choice for its named depths, else basic units when the depth fits them.
      layers_per_unit: weighted layers in a (basic, bottleneck) unit.
      family: the name used in error messages.

    Returns:
      ``(units, bottleneck)``.
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
        raise ValueError(f"{family} depth must be an int >= 2. Received: {depth!r}")
    choices = [False, True] if bottleneck is None else [bool(bottleneck)]
    for kind in choices:
        per_unit = 3 * layers_per_unit[int(kind)]  # three stages
        if (depth - 2) % per_unit == 0 and depth > 2:
            return (depth - 2) // per_unit, kind
    rules = " or ".join(
        f"{3 * layers_per_unit[int(k)]}n + 2 ({'bottleneck' if k else 'basic'} units)" for k in choices
    )
    raise ValueError(f"{family} depth must be {rules}. Received: {depth}")


def resnet(depth, num_classes=10, input_shape=(32, 32, 3), bottleneck=None, weight_decay=1e-4,
           name=None):
    """A pre-activation ResNet for small images (Gomez et al. 2017, Table 1 baselines).

    Three stages of units at widths 16, 32, 64 (bottleneck units expand 4x), stride 2
    between stages, global average pooling and a dense classifier. Basic units shortcut
    with zero-padded channels (no parameters); bottleneck units project with a 1x1 convolution
    where the shape changes.

    Args:
      depth: 32, 110, 164 (the paper's), or any ``6n + 2`` / ``9n + 2``.
      num_classes: classifier outputs (logits).
      input_shape: ``(height, width, channels)``.
      bottleneck: force the unit type (default: the paper's for 164, else basic if it fits).
      weight_decay: L2 factor on convolution and dense kernels (0 disables).
      name: model name (default ``resnet-<depth>``).

    Returns:
      An uncompiled ``keras.Model`` mapping images to logits.

    Example:
      >>> model = resnet(32)
      >>> round(model.count_params(), -4)  # BatchNormalization statistics included
      470000
    """
    if depth in PAPER and bottleneck is None:
        units, bottleneck = PAPER[depth][:2]
    else:
        units, bottleneck = units_per_stage(depth, bottleneck)
    conv = zoo_layers.conv_factory(weight_decay)
    inputs = keras.Input(input_shape)
    h = conv(BASE_WIDTH, 3)(inputs)
    expansion = 4 if bottleneck else 1
    for stage, width in enumerate((BASE_WIDTH, 2 * BASE_WIDTH, 4 * BASE_WIDTH)):
        for unit in range(units):
            stride = 2 if stage > 0 and unit == 0 else 1
            h = zoo_layers.PreActResidual(
                width, expansion=expansion, stride=stride, weight_decay=weight_decay, name=f"stage{stage + 1}_unit{unit + 1}",
            )(h)
    outputs = zoo_layers.classifier_head(h, num_classes, weight_decay)
    return keras.Model(inputs, outputs, name=name or f"resnet-{depth}")
