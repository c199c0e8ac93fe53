"""`convert(model)`: the same model with memgrad's selective layers swapped in."""

from __future__ import annotations

import dataclasses
import inspect

import keras

from memgrad._src import tf_internals
from memgrad._src.selective import registry
from memgrad._src.selective.functional import LeanFunctional
from memgrad._src.selective.sequential import LeanSequential

# Exact Keras class -> memgrad replacement (subclasses of Keras layers are left alone:
# they may override call()).
REPLACEMENTS = {registry.keras_counterpart(layer): layer for layer in registry.LAYERS}

# Why a layer with no memgrad version keeps no more than it needs (or what it keeps).
NOT_NEEDED = {
    keras.layers.InputLayer: None,  # not listed
    keras.layers.Flatten: "no memgrad version needed: its gradient keeps no tensor (a reshape)",
    keras.layers.Reshape: "no memgrad version needed: its gradient keeps no tensor (a reshape)",
    keras.layers.Permute: "no memgrad version needed: its gradient keeps no tensor (a transpose)",
    keras.layers.Softmax: "no memgrad version: its gradient needs its output, which is what TensorFlow keeps",
    keras.layers.Multiply: "no memgrad version: its gradient needs both inputs, which is what TensorFlow keeps",
}


@dataclasses.dataclass
class ConversionReport:
    """What `convert` swapped.

    Attributes:
      swapped: ``(layer name, Keras class name)`` of every replaced layer.
      kept: ``(layer name, reason)`` of every layer left unconverted (input
        layers and nested models, whose layers are listed, aside): a
        replaceable type with a setting memgrad's layer does not handle, a
        ``Lambda`` layer (shared with the original model), a subclass or custom
        layer, or a type with no memgrad version and why.
    """

    swapped: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"memgrad.selective.convert: swapped {len(self.swapped)} layer(s)"]
        lines += [f"  {name}: {cls} -> memgrad" for name, cls in self.swapped]
        lines += [f"  kept {name}: {reason}" for name, reason in self.kept]
        return "\n".join(lines)


def _unsupported(layer):
    """The reason ``layer`` (an instance of a memgrad class) cannot run memgrad's way, or ``None``."""
    check = getattr(layer, "_check_supported", None)
    if check is not None:
        try:
            check()
        except ValueError as error:
            return str(error)
    return None


def _replacement(layer, report):
    target = REPLACEMENTS.get(type(layer))
    if target is None:
        report.kept.append((layer.name, _why_not_converted(layer)))
        return None
    try:
        candidate = target.from_config(layer.get_config())
    except (ValueError, TypeError) as error:  # a constructor check (Activation); Keras re-raises it as TypeError
        cause = error.__cause__ or error.__context__
        report.kept.append((layer.name, str(cause if isinstance(cause, ValueError) else error)))
        return None
    reason = _unsupported(candidate)
    if reason is not None:
        report.kept.append((layer.name, reason))
        return None
    report.swapped.append((layer.name, type(layer).__name__))
    return candidate


def _why_not_converted(layer):
    for cls, reason in NOT_NEEDED.items():
        if type(layer) is cls:
            return reason
    base = next((cls for cls in REPLACEMENTS if isinstance(layer, cls)), None)
    if base is not None:
        return (f"a subclass of keras.layers.{base.__name__} (it may override call()), left as it is; "
                "its sublayers of replaceable types are swapped in place")
    if type(layer).__module__.startswith("keras."):
        return f"no memgrad version of keras.layers.{type(layer).__name__}: TensorFlow's tape keeps what it keeps"
    return (f"a custom layer ({type(layer).__module__}.{type(layer).__name__}), left as it is; its sublayers "
            "of replaceable types are swapped in place")


def _sublayers(layer):
    """The layers held in ``layer``'s attributes (directly or in lists/tuples/dicts), and a
    model's layers."""
    found = list(layer.layers) if isinstance(layer, keras.Model) else []
    for value in vars(layer).values():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        found += [v for v in values if isinstance(v, keras.layers.Layer) and v is not layer]
    return found


def _copy_trainable(original, copy):
    """Gives ``copy``'s sublayers the ``trainable`` flags of ``original``'s.

    A layer rebuilt from its config creates its sublayers when it is built, after its own
    ``trainable`` was set, so they come out trainable: a frozen keras-hub encoder layer
    would have trainable attention projections in the copy.
    """
    for attribute, value in vars(original).items():
        twin = vars(copy).get(attribute)
        pairs = zip(value, twin) if isinstance(value, (list, tuple)) and isinstance(twin, (list, tuple)) else [
            (value, twin)]
        for sub, sub_copy in pairs:
            if (isinstance(sub, keras.layers.Layer) and isinstance(sub_copy, keras.layers.Layer)
                    and sub is not original and type(sub) is type(sub_copy)):
                sub_copy.trainable = sub.trainable
                _copy_trainable(sub, sub_copy)


def _accepts_what_keras_passes(original, target):
    """Whether ``target.call`` takes every argument of ``original.call`` (Keras decides at
    construction which call-context arguments, e.g. ``training``, to pass)."""
    return set(inspect.signature(original.call).parameters) <= set(inspect.signature(target.call).parameters)


def _swap_sublayers_in_place(layer, report, path, seen):
    """Turns the replaceable sublayers of a custom (cloned) layer into memgrad's classes.

    A custom layer builds its sublayers itself, so they cannot be replaced by cloning;
    memgrad's classes subclass the Keras ones without adding state, so the swap keeps
    every weight. Its config does not name the sublayers' classes: a reloaded model has
    Keras's there again (convert it again).
    """
    for sub in _sublayers(layer):
        if id(sub) in seen:
            continue
        seen.add(id(sub))
        name = f"{path}/{sub.name}"
        original = type(sub)
        target = REPLACEMENTS.get(original)
        if target is not None and not _accepts_what_keras_passes(original, target):
            report.kept.append((name, f"memgrad's {target.__name__}.call() does not take every argument of "
                                      f"Keras's {original.__name__}.call()"))
        elif target is not None:
            sub.__class__ = target
            reason = _unsupported(sub)
            if reason is None:
                report.swapped.append((name, f"{original.__name__} (swapped in place)"))
            else:
                sub.__class__ = original
                report.kept.append((name, reason))
        elif type(sub) not in NOT_NEEDED:
            _swap_sublayers_in_place(sub, report, name, seen)


def _uses_masks(model) -> bool:
    return any(isinstance(layer, keras.layers.Masking) or getattr(layer, "mask_zero", False)
               for layer in model.layers)


def _trainable_signature(model):
    """(name, shape) of each trainable variable, in order (paths differ: a loaded model's carry its name)."""
    return [(v.name, tuple(v.shape)) for v in model.trainable_variables]


def convert(model, return_report=False):
    """Returns a copy of ``model`` with memgrad's selective-differentiation layers swapped in.

    Every layer of a type in ``REPLACEMENTS`` (``Dense``, ``EinsumDense``,
    ``Conv1D``, ``Conv2D``, ``Conv3D``, ``Conv2DTranspose``, ``DepthwiseConv2D``,
    ``SeparableConv2D``, ``BatchNormalization``, ``LayerNormalization``, ``ReLU``,
    ``Activation`` (relu, gelu), ``MaxPooling2D``, ``AveragePooling2D``,
    ``GlobalAveragePooling2D``, ``ZeroPadding2D``, ``Add``, ``Concatenate``,
    ``Embedding``, ``Dropout``) is replaced by memgrad's drop-in version (same
    config, same weights), which keeps for backprop only what the requested
    gradients need: a frozen layer's input is not kept (so, in eager mode, its
    weight gradients are available only if a tape watches them before the forward
    pass), a ReLU keeps a 1-byte mask. Outputs are unchanged. The original model
    is not modified. A functional model comes back as a `LeanFunctional` and a
    Sequential one as a `LeanSequential` (nested models too): their eager forward
    pass releases each layer's output after its last use and runs layers no
    gradient can flow through unrecorded (Keras's runner keeps every output until
    the call returns). Custom layers (keras-hub's) are copied and their
    replaceable sublayers swapped in place. ``Lambda`` layers, whose Python
    function cannot be copied, are shared with the original model. The report
    lists every layer left unconverted with its reason.

    Args:
      model: a built Keras ``Sequential`` or functional ``Model``.
      return_report: also return a `ConversionReport`.

    Returns:
      The converted model, or ``(model, report)`` with ``return_report=True``.

    Raises:
      ValueError: for a subclassed model (its ``call`` cannot be rewired) or an
        unbuilt one.
      RuntimeError: if the copy's trainable variables differ from the
        original's (a layer that could not be copied faithfully).

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
    custom = []  # cloned custom layers, whose sublayers are swapped once built

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
        copy = layer.__class__.from_config(layer.get_config())
        if type(layer) not in NOT_NEEDED:  # a custom layer or subclass: its sublayers may be replaceable
            custom.append((layer, copy))
        return copy

    converted = keras.models.clone_model(model, clone_function=clone)
    seen = set()
    for original, copy in custom:
        _copy_trainable(original, copy)
        _swap_sublayers_in_place(copy, report, copy.name, seen)
    report.kept = [(name, reason) for name, reason in report.kept if reason is not None]
    if isinstance(converted, keras.Sequential) and not _uses_masks(converted):
        converted = LeanSequential([keras.Input(batch_shape=model.inputs[0].shape, dtype=model.inputs[0].dtype)]
                                   + converted.layers, name=model.name, trainable=model.trainable)
    elif not isinstance(converted, keras.Sequential):
        converted = LeanFunctional(converted.input, converted.output, name=model.name, trainable=model.trainable)
    converted.set_weights(model.get_weights())
    expected, received = _trainable_signature(model), _trainable_signature(converted)
    if expected != received:
        raise RuntimeError(
            "memgrad.selective.convert: the converted model's trainable variables differ from the original's "
            f"(a layer memgrad could not copy faithfully). Expected: {expected}. Received: {received}")
    return (converted, report) if return_report else converted
