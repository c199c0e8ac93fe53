"""`convert(model)`: the same model with memgrad's selective layers swapped in."""

from __future__ import annotations

import dataclasses

import keras

from memgrad._src import tf_internals
from memgrad._src.selective.dropout import Dropout
from memgrad._src.selective.linear import Conv1D, Conv2D, Conv2DTranspose, Conv3D, Dense
from memgrad._src.selective.normalization import BatchNormalization
from memgrad._src.selective.pooling import MaxPooling2D
from memgrad._src.selective.relu import ReLU
from memgrad._src.selective.functional import LeanFunctional
from memgrad._src.selective.sequential import LeanSequential

# Exact Keras class -> memgrad replacement (subclasses of Keras layers are left alone:
# they may override call()).
REPLACEMENTS = {
    keras.layers.Dense: Dense,
    keras.layers.Conv1D: Conv1D,
    keras.layers.Conv2D: Conv2D,
    keras.layers.Conv3D: Conv3D,
    keras.layers.Conv2DTranspose: Conv2DTranspose,
    keras.layers.MaxPooling2D: MaxPooling2D,
    keras.layers.Dropout: Dropout,
    keras.layers.BatchNormalization: BatchNormalization,
    keras.layers.ReLU: ReLU,
}


@dataclasses.dataclass
class ConversionReport:
    """What `convert` swapped.

    Attributes:
      swapped: ``(layer name, Keras class name)`` of every replaced layer.
      kept: ``(layer name, reason)`` of every layer left unconverted for a
        reason: a replaceable type with a setting memgrad's layer does not
        handle, or a ``Lambda`` layer (shared with the original model).
    """

    swapped: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"memgrad.selective.convert: swapped {len(self.swapped)} layer(s)"]
        lines += [f"  {name}: {cls} -> memgrad" for name, cls in self.swapped]
        lines += [f"  kept {name}: {reason}" for name, reason in self.kept]
        return "\n".join(lines)


def _replacement(layer, report):
    target = REPLACEMENTS.get(type(layer))
    if target is None:
        return None
    candidate = target.from_config(layer.get_config())
    check = getattr(candidate, "_check_supported", None)
    if check is not None:
        try:
            check()
        except ValueError as error:
            report.kept.append((layer.name, str(error)))
            return None
    report.swapped.append((layer.name, type(layer).__name__))
    return candidate


def _uses_masks(model) -> bool:
    return any(isinstance(layer, keras.layers.Masking) or getattr(layer, "mask_zero", False)
               for layer in model.layers)


def convert(model, return_report=False):
    """Returns a copy of ``model`` with memgrad's selective-differentiation layers swapped in.

    ``Dense``, ``Conv1D/2D/3D``, ``Conv2DTranspose``, ``BatchNormalization``,
    ``ReLU``, ``MaxPooling2D`` and ``Dropout`` layers are replaced by memgrad's
    drop-in versions (same config, same weights), which keep for backprop only
    what the requested gradients need: a frozen layer's input is not kept (so, in
    eager mode, its weight gradients are available only if a tape watches them
    before the forward pass), a ReLU keeps a 1-byte mask. Outputs are unchanged.
    Works for Sequential and functional models, nested ones included; the
    original model is not modified. ``Lambda`` layers, whose Python function
    cannot be copied, are shared with the original model and listed in the
    report. A Sequential model comes back as a `LeanSequential`, whose eager
    forward pass releases each layer's output as soon as it can (Keras's
    functional runner keeps them all until the call returns).

    Args:
      model: a built Keras ``Sequential`` or functional ``Model``.
      return_report: also return a `ConversionReport`.

    Returns:
      The converted model, or ``(model, report)`` with ``return_report=True``.

    Raises:
      ValueError: for a subclassed model (its ``call`` cannot be rewired) or an
        unbuilt one.

    Example:
      >>> base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu")])
      >>> lean, report = convert(base, return_report=True)
      >>> print(report)
      memgrad.selective.convert: swapped 1 layer(s) ...
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"convert() expects a Keras Model. Received: {model!r}")
    if not isinstance(model, (keras.Sequential, tf_internals.keras_functional)):
        raise ValueError(
            "convert() rewires Sequential and functional models; a subclassed model's call() "
            f"cannot be rewired, use memgrad.layers' selective layers in it directly. Received: "
            f"{type(model).__name__}"
        )
    if not model.built:
        raise ValueError(f"convert() needs a built model (call it once or give it an Input). Received: {model.name}")
    report = ConversionReport()

    def clone(layer):
        if isinstance(layer, keras.Model):  # nested: converted the same way (Sequential -> Lean)
            nested, nested_report = convert(layer, return_report=True)
            report.swapped += nested_report.swapped
            report.kept += nested_report.kept
            return nested
        if isinstance(layer, keras.layers.Lambda):
            # A copy from the config would rebuild the function from its serialized
            # bytecode, which Keras's safe mode refuses; a Lambda has no weights to copy.
            report.kept.append((layer.name, "Lambda layer: its Python function cannot be copied, so the "
                                            "converted model shares this layer with the original"))
            return layer
        replacement = _replacement(layer, report)
        if replacement is not None:
            return replacement
        return layer.__class__.from_config(layer.get_config())

    converted = keras.models.clone_model(model, clone_function=clone)
    if isinstance(converted, keras.Sequential) and not _uses_masks(converted):
        converted = LeanSequential([keras.Input(batch_shape=model.inputs[0].shape, dtype=model.inputs[0].dtype)]
                                   + converted.layers, name=model.name, trainable=model.trainable)
    elif not isinstance(converted, keras.Sequential):
        converted = LeanFunctional(converted.input, converted.output, name=model.name, trainable=model.trainable)
    converted.set_weights(model.get_weights())
    return (converted, report) if return_report else converted
