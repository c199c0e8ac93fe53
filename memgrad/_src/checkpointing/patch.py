"""`memgrad.monkey_patch`: every public alias of `tf.gradients` made `memgrad.gradients`."""

import inspect
import sys
import threading

import tensorflow as tf

from memgrad._src.checkpointing.api import TF_GRADIENTS_V1, TF_GRADIENTS_V2, gradients
from memgrad._src.checkpointing.strategies import as_strategy

_patch_lock = threading.Lock()
_patched = {}


def _public_gradient_aliases():
    """(module, name of TF's function) for every public API module exposing `gradients`.

    TensorFlow exposes the same two functions under many names: `tf.gradients`,
    `tf.compat.v2.gradients`, `tf.compat.v1.gradients`, `tf.compat.v1.compat.v1.gradients`,
    `tensorflow.compat.v2.compat.v1.gradients` (what tf_keras calls), ... Internal modules
    (`tensorflow.python...`) are left alone: TensorFlow's own code calls them.
    """
    for module in (tf.compat.v1, tf.compat.v2):  # load the lazily imported API modules
        _ = module.compat.v1, module.compat.v2
    seen = set()
    for name, module in list(sys.modules.items()):
        # An API module can sit in sys.modules under its generated name
        # (tensorflow._api.v2.compat.v1) and under the name it was imported by
        # (tensorflow.compat.v1): every name but TensorFlow's internals counts, once.
        if module is None or id(module) in seen or not name.startswith("tensorflow"):
            continue
        if name.startswith("tensorflow.python") or name.startswith("tensorflow.core"):
            continue
        function = getattr(module, "__dict__", {}).get("gradients")
        if function is TF_GRADIENTS_V1 or function is TF_GRADIENTS_V2:
            seen.add(id(module))
            yield name, module, function


def _patched_version(original, checkpoints):
    signature = inspect.signature(original)

    # No functools.wraps: autograph follows `__wrapped__` and would call TensorFlow's own
    # function instead of this one inside a tf.function.
    def patched(*args, **kwargs):
        # Bind against TensorFlow's own signature, so positional arguments past `name`
        # (which differ between the v1 and v2 functions) keep their meaning.
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError as error:
            raise TypeError(f"{original.__module__}.gradients: {error}") from None
        return gradients(checkpoints=checkpoints, **arguments)

    patched.__name__ = original.__name__
    patched.__doc__ = f"memgrad's checkpointed replacement for TensorFlow's {original.__name__}."
    patched.__memgrad_original__ = original
    return patched


def monkey_patch(checkpoints="memory"):
    """Replace every public alias of `tf.gradients` with a checkpointed version.

    That covers `tf.gradients`, `tf.compat.v1.gradients` and the other names TensorFlow
    exposes the same functions under (`tf.compat.v2.gradients`,
    `tf.compat.v1.compat.v1.gradients`, `tensorflow.compat.v2.compat.v1.gradients`, which
    tf_keras calls, ...). Code written for `tf.gradients` then saves memory unchanged.
    `memgrad.unpatch()` restores TensorFlow's functions. Code that imported the function
    itself before the patch (`from tensorflow import gradients`) keeps the original.
    Calling it again changes the strategy.

    Caveats:
      - Those of `memgrad.gradients`, which this calls: XLA and stateful ops.
      - Only `tf.gradients` and its aliases are patched: `tf.GradientTape` (and so Keras's
        own `fit`) is not; use `memgrad.GradientTape` or `memgrad.enable_checkpointing`.
        An x no y depends on gets None (zeros with ``unconnected_gradients='zero'``), as
        with `tf.gradients`.

    Args:
      checkpoints: the strategy every patched call uses (see `memgrad.gradients`).

    Returns:
      None.

    Raises:
      ValueError: for an unknown ``checkpoints`` string (before anything is patched).
      TypeError: for a ``checkpoints`` of no accepted kind.

    Example:
      ```python
      memgrad.monkey_patch(checkpoints="memory")
      grads = tf.gradients(loss, variables)   # now checkpointed
      memgrad.unpatch()
      ```
    """
    as_strategy(checkpoints)  # an unknown mode or a wrong type fails here, not at a call
    with _patch_lock:
        if not _patched:
            for name, module, original in _public_gradient_aliases():
                _patched[name] = (module, original)
        versions = {}
        for module, original in _patched.values():
            if original not in versions:
                versions[original] = _patched_version(original, checkpoints)
            module.gradients = versions[original]


def unpatch():
    """Restore TensorFlow's `tf.gradients` and every alias `monkey_patch` replaced.

    Returns:
      None.
    """
    with _patch_lock:
        for module, original in _patched.values():
            module.gradients = original
        _patched.clear()
