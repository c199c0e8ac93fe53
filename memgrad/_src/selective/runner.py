"""Calling one layer of a lean runner: unrecorded when no gradient can flow into or out of it."""

from __future__ import annotations

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.selective.lean_layer import is_watched, stop_recording


def _tensors(structure):
    return [t for t in tf.nest.flatten(structure) if isinstance(t, (tf.Tensor, tf.Variable))]


def needs_recording(operation, args, kwargs) -> bool:
    """Whether a tape may want a gradient through ``operation`` called on ``args``/``kwargs``.

    It may if one of its tensor inputs is watched, it has trainable weights, or a tape
    watched one of its (frozen) weights before the call. Otherwise nothing recorded for it
    can be used: its weights are frozen and no gradient flows back into its inputs. Keras's
    variables are watched whenever they are read, so a frozen Keras layer run on recorded
    inputs keeps for backprop everything its ops keep; run unrecorded it keeps nothing.
    """
    if not tf_internals.could_possibly_record():
        return False
    if any(is_watched(t) for t in _tensors((args, kwargs))):
        return True
    if getattr(operation, "trainable_weights", None):
        return True
    weights = getattr(operation, "weights", None) or []
    return bool(weights) and bool(tf_internals.should_record_backprop(
        [tf_internals.backend_variable(v).handle for v in weights]))


def call_operation(operation, call, args, kwargs):
    """``call(*args, **kwargs)``, unrecorded if `needs_recording` says no tape can use it."""
    if needs_recording(operation, args, kwargs):
        return call(*args, **kwargs)
    with stop_recording():
        return call(*args, **kwargs)
