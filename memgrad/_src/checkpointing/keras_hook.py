"""Checkpointed `model.fit` for any Keras model.

`enable_checkpointing` gives one model its own `train_step` (an attribute of that model
instance, nothing process-wide): Keras's documented recipe for customizing `fit` with the
TensorFlow backend, with `memgrad.GradientTape` in place of `tf.GradientTape`. Other models
in the process, and other instances of the same class, keep Keras's own `train_step`.
"""

import inspect
import warnings

import keras
import tensorflow as tf

from memgrad._src.checkpointing.strategies import as_strategy
from memgrad._src.checkpointing.tape import GradientTape

_MARK = "__memgrad_checkpoints__"  # set on the train_step functions this module makes


def _takes_training(method):
    """Whether ``model.compute_loss`` accepts ``training=`` (added in Keras 3.3; an override
    written for Keras 3.0-3.2 may not)."""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return True
    return "training" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _loss_tracker(model):
    """The "loss" metric `compile` creates (the first of `model.metrics`), or None."""
    if not model.compiled:
        return None
    return next((m for m in model.metrics if m.name == "loss"), None)


def _make_train_step(model, checkpoints):
    """A `train_step` for ``model``: Keras's documented custom-step recipe
    (keras.io, "Customizing what happens in fit() with TensorFlow") on a memgrad tape."""
    loss_takes_training = _takes_training(model.compute_loss)

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with GradientTape(checkpoints=checkpoints) as tape:
            y_pred = model(x, training=True)
            loss_kwargs = {"training": True} if loss_takes_training else {}
            loss = model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, **loss_kwargs)
            # The loss we differentiate: scaled up under mixed precision (a
            # LossScaleOptimizer's scale_loss; identity for other optimizers).
            scaled = loss
            if model.optimizer is not None and hasattr(model.optimizer, "scale_loss"):
                scaled = model.optimizer.scale_loss(loss)
        tracker = _loss_tracker(model)
        if tracker is not None:
            # compute_loss divides by the number of replicas (the all-reduce sums); the
            # reported loss is the full-batch one, weighted by this replica's batch size.
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            reported = loss * tf.cast(replicas, loss.dtype) if replicas > 1 else loss
            first = next(t for t in tf.nest.flatten(x) if t is not None)
            tracker.update_state(reported, sample_weight=tf.shape(first)[0])
        trainable_weights = model.trainable_weights
        if trainable_weights:
            grads = tape.gradient(scaled, trainable_weights)
            model.optimizer.apply(grads, trainable_weights)  # unscales under mixed precision
        else:
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    setattr(train_step, _MARK, checkpoints)
    return train_step


def _make_train_function(model):
    """``model.make_train_function`` that first builds the optimizer's variables, when the
    model's own exist (a functional or Sequential model, or one already called).

    Keras (TensorFlow backend, no distribution strategy) leaves the optimizer to build while
    it traces the first step, and TensorFlow traces a function that creates variables on its
    first call twice, so the rewrite ran twice: ResNet50's first `fit` call took 23.9 s, 10.5
    s built first (32x32 images, 2-core CPU). Keras builds it the same way before tracing
    under a distribution strategy."""

    def make_train_function(force=False):
        optimizer = model.optimizer
        if (model.train_function is None or force) and model.built and optimizer is not None \
                and not optimizer.built:
            with model.distribute_strategy.scope():
                optimizer.build(model.trainable_variables)
        return type(model).make_train_function(model, force)

    setattr(make_train_function, _MARK, True)
    return make_train_function


def _own_train_step(model):
    """The train_step this module set on ``model``, or None."""
    step = vars(model).get("train_step")
    return step if step is not None and hasattr(step, _MARK) else None


def enable_checkpointing(model, checkpoints="memory"):
    """Make `model.fit` train this model with checkpointed gradients.

    The model gets its own `train_step` (set on the instance; no other model, and nothing
    process-wide, changes): Keras's documented custom-`train_step` recipe with
    `memgrad.GradientTape`. It unpacks ``(x, y, sample_weight)``, runs
    ``model(x, training=True)`` and ``model.compute_loss``, scales the loss under mixed
    precision, applies the checkpointed gradients with ``model.optimizer.apply`` and returns
    ``model.compute_metrics``. It may be called before or after `compile`; calling it again
    replaces the strategy, and `disable_checkpointing` restores Keras's `train_step`.
    The optimizer's variables are built before the first step is traced (where the model's
    own exist), so `fit` traces and rewrites the step once, not twice: Keras would create
    them inside the trace (ResNet50's first `fit` call: 23.9 s -> 10.5 s). Metrics given to
    `compile` by name still build theirs in the trace; pass metric objects to avoid that.

    Works on Sequential, functional and subclassed models that use Keras's own
    `train_step`. A model class that overrides `train_step` is rejected (its step would be
    silently replaced): use `memgrad.GradientTape` inside that `train_step` instead.

    Caveats:
      - Those of `memgrad.gradients`, which this calls: XLA and stateful ops.
      - ``jit_compile`` stays as the user set it, in either order of this call and
        `compile` (``'auto'`` included, which Keras resolves to XLA on a GPU).
      - Sources: the step differentiates ``model.trainable_weights``, all of which the
        tape watches; a weight the loss does not reach gets None (the optimizer skips it),
        as in Keras's own step.

    Args:
      model: a compiled or uncompiled `keras.Model`.
      checkpoints: the strategy (see `memgrad.gradients`).

    Returns:
      The same model, for chaining.

    Raises:
      TypeError: ``model`` is not a `keras.Model`, its class overrides `train_step`, or
        ``checkpoints`` is of no accepted kind.
      ValueError: ``checkpoints`` is None or an unknown string.
      RuntimeError: the Keras backend is not TensorFlow.

    Example:
      ```python
      model = memgrad.enable_checkpointing(model, checkpoints="memory")
      model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
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
    as_strategy(checkpoints)  # an unknown mode or a wrong type fails here, not in fit
    if type(model).train_step is not keras.Model.train_step:
        owner = next(c for c in type(model).__mro__ if "train_step" in vars(c))
        raise TypeError(
            f"enable_checkpointing replaces Keras's own train_step, but {type(model).__name__} "
            f"overrides it (in {owner.__module__}.{owner.__qualname__}); replacing it would "
            "drop your step. Use memgrad.GradientTape(checkpoints=...) in place of "
            "tf.GradientTape inside that train_step instead."
        )
    if "train_step" in vars(model) and _own_train_step(model) is None:
        raise TypeError(
            "enable_checkpointing replaces Keras's own train_step, but this model instance "
            f"has its own train_step attribute ({vars(model)['train_step']!r}). Use "
            "memgrad.GradientTape inside it instead."
        )
    model.train_step = _make_train_step(model, checkpoints)
    model.make_train_function = _make_train_function(model)
    model.train_function = None  # traced again, with the new step
    return model


def disable_checkpointing(model):
    """Undo `enable_checkpointing`: `model.fit` uses Keras's own `train_step` again.

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
    if _own_train_step(model) is not None:
        del model.train_step
        if hasattr(vars(model).get("make_train_function"), _MARK):
            del model.make_train_function
        model.train_function = None
    return model
