"""Checkpointed `model.fit` for any Keras model, and a layer that marks checkpoints.

Keras 3's TensorFlow trainer builds its training step with `tf.GradientTape`. The hook
wraps the model's `train_step` so that, while it is being traced, the trainer's
`tf.GradientTape` is `memgrad.GradientTape`. The switch is thread-local (each replica of a
`tf.distribute` strategy traces in its own thread) and applies to this model only.
"""

import contextlib
import threading
import types
import warnings

import keras
import tensorflow as tf

from memgrad._src.checkpointing.api import checkpoint
from memgrad._src.checkpointing.tape import GradientTape

_state = threading.local()
_install_lock = threading.Lock()


class _TensorFlowWithCheckpointedTape(types.ModuleType):
    """`tensorflow` as the Keras trainer sees it, with a switchable `GradientTape`."""

    def __init__(self, module):
        super().__init__(module.__name__)
        self._module = module

    def __getattr__(self, name):
        if name == "GradientTape":
            checkpoints = getattr(_state, "checkpoints", None)
            if checkpoints is not None:
                return lambda *args, **kwargs: GradientTape(
                    *args, checkpoints=checkpoints, **kwargs
                )
        return getattr(self._module, name)


def _trainer_module():
    from keras.src.backend.tensorflow import trainer  # Keras 3, TensorFlow backend

    return trainer


def _install():
    with _install_lock:
        trainer = _trainer_module()
        current = getattr(trainer, "tf", None)
        if isinstance(current, _TensorFlowWithCheckpointedTape):
            return
        if current is not tf:
            raise RuntimeError(
                "memgrad.enable_checkpointing supports Keras 3's TensorFlow trainer, which "
                "builds its step with tf.GradientTape. Received a Keras whose trainer "
                f"module does not (keras {keras.__version__})."
            )
        trainer.tf = _TensorFlowWithCheckpointedTape(tf)


@contextlib.contextmanager
def _checkpointed_tapes(checkpoints):
    previous = getattr(_state, "checkpoints", None)
    _state.checkpoints = checkpoints
    try:
        yield
    finally:
        _state.checkpoints = previous


def enable_checkpointing(model, checkpoints="memory"):
    """Make `model.fit` train with checkpointed gradients.

    Works on Sequential, functional and subclassed models that use Keras's own
    `train_step`. A model that defines its own `train_step` should use
    `memgrad.GradientTape` in it instead (a warning says so). XLA drops the control
    dependencies that keep recomputation late, so `jit_compile` is turned off for the model
    (with a warning) if it was on.

    Args:
      model: a compiled or uncompiled `keras.Model`.
      checkpoints: the strategy (see `memgrad.gradients`).

    Returns:
      The same model, for chaining.

    Example:
      ```python
      model = memgrad.enable_checkpointing(model, checkpoints="memory")
      model.fit(x, y, batch_size=256)
      ```
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"enable_checkpointing expects a keras.Model. Received: {type(model).__name__}"
        )
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError(
            "memgrad checkpoints TensorFlow graphs. Received Keras backend "
            f"{keras.backend.backend()!r}; set KERAS_BACKEND=tensorflow."
        )
    if checkpoints is None:
        raise ValueError("checkpoints must be a strategy; use disable_checkpointing to undo.")
    _install()
    trainer = _trainer_module()
    if type(model).train_step is not trainer.TensorFlowTrainer.train_step:
        warnings.warn(
            f"{type(model).__name__} defines its own train_step; checkpointing reaches it "
            "only if it calls super().train_step or uses tf.GradientTape from Keras's "
            "trainer. Use memgrad.GradientTape inside it to be sure.",
            stacklevel=2,
        )
    disable_checkpointing(model)
    original = model.train_step

    def train_step(data):
        with _checkpointed_tapes(checkpoints):
            return original(data)

    model.train_step = train_step
    model._memgrad_checkpoints = checkpoints
    if getattr(model, "_jit_compile", None):
        warnings.warn(
            "XLA ignores the control dependencies that keep recomputation late; "
            "memgrad.enable_checkpointing turns jit_compile off for this model.",
            stacklevel=2,
        )
        model.jit_compile = False
    model.train_function = None
    return model


def disable_checkpointing(model):
    """Undo `enable_checkpointing`: `model.fit` uses plain gradients again.

    Args:
      model: a `keras.Model` (one never passed to `enable_checkpointing` is
        returned unchanged).

    Returns:
      The same model.

    Raises:
      TypeError: if ``model`` is not a `keras.Model`.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"disable_checkpointing expects a keras.Model. Received: {model!r}")
    if "train_step" in vars(model):
        del model.train_step
        model.train_function = None
    if hasattr(model, "_memgrad_checkpoints"):
        del model._memgrad_checkpoints
    return model
