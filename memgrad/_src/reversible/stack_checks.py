"""What `ReversibleSequence` checks about its stack before it runs: the blocks themselves,
which variables each one owns, and the dtype the stack runs (and inverts) in."""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.reversible.base import ReversibleBlock, layer_name, network_dtype


def _variable_keys(block):
    """Keys of the TensorFlow variables behind a block's Keras variables (and their replicas)."""
    keys = set()
    for variable in block.trainable_variables:
        inner = tf_internals.backend_variable(variable)
        keys.add(id(inner))
        keys.update(id(component) for component in getattr(inner, "values", ()))
    return keys


def sources_per_block(blocks, variables):
    """For each block, the indices of ``variables`` it may need gradients for.

    Giving each block's tape only its own variables keeps tracing linear in
    depth. Variables no block's Keras weights account for (a tfp bijector's, say)
    go to every block.
    """
    owned = []
    for block in blocks:
        keys = _variable_keys(block)
        owned.append([i for i, v in enumerate(variables) if id(v) in keys])
    claimed = {i for indices in owned for i in indices}
    unclaimed = [i for i in range(len(variables)) if i not in claimed]
    return [sorted(indices + unclaimed) for indices in owned]


def as_block(candidate, index):
    if isinstance(candidate, ReversibleBlock):
        return candidate
    try:
        import tensorflow_probability as tfp
    except ImportError:  # pragma: no cover - tensorflow-probability is a dependency
        tfp = None
    if tfp is not None and isinstance(candidate, tfp.bijectors.Bijector):
        from memgrad._src.reversible.bijector import BijectorBlock

        return BijectorBlock(candidate)
    raise ValueError(
        "ReversibleSequence runs reversible blocks only: AdditiveCoupling, AffineCoupling, a "
        "memgrad.layers.ReversibleBlock with forward and inverse (ActNorm, Invertible1x1Conv, "
        f"Squeeze, ChannelPermutation) or a tfp.bijectors.Bijector. Block {index} has no "
        f"inverse. Received: {layer_name(candidate) if hasattr(candidate, 'name') else repr(candidate)}"
    )


def _networks_dtype(blocks):
    """The one dtype the networks inside ``blocks`` compute in (`network_dtype`), else ``None``."""
    dtypes = set()
    for block in blocks:
        for child in block._flatten_layers(include_self=False, recursive=False):
            dtypes.add(network_dtype(child))
    return dtypes.pop() if len(dtypes) == 1 else None


def stack_dtype(blocks, dtype):
    """The stack's dtype: ``dtype`` if given, else the one its bijectors fix (float64 flows).

    Without ``dtype`` and without such bijectors, a stack whose blocks' networks all compute
    in float64 (`network_dtype`, e.g. float64 Dense layers in a dtype-less Sequential) is a
    float64 stack: its input is not rounded to float32 first.

    Keras casts a layer's floating-point inputs to its compute dtype, so a float32 stack
    would hand float64 bijectors float32 tensors. A bijector built from float64 tensors
    (or a float64 Keras network) fixes its block's dtype; the stack follows it, and
    refuses bijectors that disagree with each other or with an explicit ``dtype``.
    """
    pinned = [(index, block, block.required_dtype) for index, block in enumerate(blocks)
              if getattr(block, "required_dtype", None) is not None]
    if not pinned:
        if dtype is None and _networks_dtype(blocks) == "float64":
            return "float64"
        return dtype
    described = ", ".join(f"block {index} ({layer_name(block)}) {name}" for index, block, name in pinned)
    if len({name for _, _, name in pinned}) > 1:
        raise ValueError(
            "ReversibleSequence runs every block in one dtype, but its bijectors were built in "
            "different dtypes; build them all from tensors (and Keras layers) of one dtype. "
            f"Received: {described}"
        )
    required = pinned[0][2]
    if dtype is None:
        return required
    given = keras.dtype_policies.get(dtype).compute_dtype
    if given != required:
        raise ValueError(
            f"ReversibleSequence was given dtype={given!r}, but its bijectors compute in "
            f"{required}; leave dtype out (the stack then follows its bijectors) or build the "
            f"bijectors in {given}. Received: {described}"
        )
    return dtype


# The dtype of the invertible arithmetic for each compute dtype, with invertible_dtype="auto".
# Measured (scripts/drift_table.py, 64 additive blocks of 3x3 convolutions): carried in float32
# the rebuilt activations drift and the gradients are 7.7e-5 off plain autodiff (16 Glow steps:
# 2.1e-3); carried in float64 (their gradients in float32) 4.1e-7 (1.7e-7), at no growth of
# memory with depth.
_AUTO_INVERTIBLE_DTYPES = {"float16": "float32", "bfloat16": "float32", "float32": "float64",
                           "float64": "float64"}


def checked_invertible_dtype(blocks, requested, compute_dtype):
    """The dtype the stack carries between its blocks: ``requested``, or the "auto" choice.

    "auto" widens float16/bfloat16 to float32 and float32 to float64 when every block accepts
    a wider input (``accepts_invertible_dtype``), and keeps the compute dtype otherwise.
    """
    unaware = [(index, block) for index, block in enumerate(blocks)
               if not getattr(block, "accepts_invertible_dtype", False)]
    if requested is None or requested == "auto":
        if unaware:
            return compute_dtype
        return _AUTO_INVERTIBLE_DTYPES.get(compute_dtype, compute_dtype)
    try:
        name = tf.as_dtype(requested).name
    except TypeError:
        name = None
    if name not in ("float16", "bfloat16", "float32", "float64"):
        raise ValueError(
            "ReversibleSequence invertible_dtype must be 'auto' or a floating dtype (float16, "
            f"bfloat16, float32, float64). Received: {requested!r}"
        )
    if name != compute_dtype and unaware:
        index, block = unaware[0]
        raise ValueError(
            f"ReversibleSequence invertible_dtype={name!r} differs from its compute dtype "
            f"{compute_dtype!r}, but block {index} ({layer_name(block)}) does not accept inputs "
            "of another dtype (it lacks accepts_invertible_dtype = True); use "
            f"invertible_dtype='auto' or {compute_dtype!r}. Received: invertible_dtype={requested!r}"
        )
    return name


def positive_number(name, value, allow_bool=False):
    """``value`` as a positive finite float, or a ValueError naming ``name``."""
    valid = (isinstance(value, (int, float)) and (allow_bool or not isinstance(value, bool))
             and math.isfinite(float(value)) and float(value) > 0)
    if not valid:
        raise ValueError(
            f"ReversibleSequence {name} must be a positive, finite number. Received: "
            f"{name}={value!r}"
        )
    return float(value)


def relative_error(rebuilt, original):
    """``max|rebuilt - original| / max|original|`` as a Python float (NaN if either is not finite)."""
    original = tf.cast(original, tf.float64)
    error = tf.reduce_max(tf.abs(tf.cast(rebuilt, tf.float64) - original))
    scale = tf.reduce_max(tf.abs(original))
    error, scale = float(error), float(scale)
    if not (math.isfinite(error) and math.isfinite(scale)):
        return float("nan")
    return error / scale if scale > 0 else error
