"""Training steps of one model under each memory strategy, and the sweep `memgrad-profile` runs.

A *model* is one of the built-in families (``coupling``, the default headline workload, and the
zoo's ``resnet``, ``revnet``, ``densenet``, ``glow``), a Keras model file (``.keras``, loaded with
``safe_mode=True``) or a Python builder ``'module:function'`` returning a Keras model. A
*strategy* is how the step computes gradients:

- ``plain``: ``tf.GradientTape``, every activation kept;
- ``memory`` / ``speed``: ``memgrad.GradientTape(checkpoints=...)``, automatic checkpointing;
- ``reversible``: the model's reversible form (coupling stacks, RevNet, Glow), whose backward
  rebuilds activations from outputs;
- ``selective``: ``memgrad.selective.convert(model)``, layers that keep only what the requested gradients need.

Every step is a ``tf.function`` running one SGD update on a loss that needs no labels (the mean
square of the model's outputs), so any model can be profiled on synthetic inputs.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import os
import zipfile

import keras
import tensorflow as tf

from memgrad.cli.arguments import BUILT_IN, STRATEGIES

IMAGE_SHAPE = (16, 16, 3)  # the zoo models' input in a sweep: small enough for a CPU

DEFAULT_DEPTHS = {
    "coupling": (2, 4, 8, 16),
    "resnet": (20, 32, 44, 56),
    "revnet": (26, 38, 50, 62),
    "densenet": (16, 40, 70, 100),
    "glow": (4, 8, 16, 32),
}
DEFAULT_BATCH = {"coupling": 256, "resnet": 32, "revnet": 32, "densenet": 16, "glow": 32}
_STRATEGIES_OF = {
    "coupling": STRATEGIES,
    "resnet": ("plain", "memory", "speed", "selective"),
    "revnet": ("plain", "reversible"),
    "densenet": ("plain", "memory", "speed", "selective"),
    "glow": ("plain", "reversible"),
}
_USER_MODEL_STRATEGIES = ("plain", "memory", "speed", "selective")


class ProfileError(ValueError):
    """A model, strategy or depth the profiler cannot run, with a one-line reason."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What to profile.

    Attributes:
      source: a built-in name, a ``.keras`` path or ``'module:function'``.
      kind: ``'built-in'``, ``'file'`` or ``'builder'``.
      strategies: the strategies this model supports.
      default_depths: depths swept when none are given (empty: a file has no depth, a builder
        is called without ``depth=`` unless depths are given).
      default_batch: the batch size used when none is given.
      width: units of the ``coupling`` model (ignored by the others).
    """

    source: str
    kind: str
    strategies: tuple
    default_depths: tuple
    default_batch: int
    width: int = 256



def model_spec(source, width=256) -> ModelSpec:
    """Resolves a ``--model`` argument into a `ModelSpec`.

    Args:
      source: ``'coupling'``, ``'resnet'``, ``'revnet'``, ``'densenet'``, ``'glow'``, a path to a
        ``.keras`` file, or ``'module:function'``.
      width: units of the ``coupling`` model.

    Returns:
      A `ModelSpec`.

    Raises:
      ProfileError: for anything else, naming what was expected.

    Example:
      >>> spec = model_spec("coupling", width=128)
      >>> spec.strategies
      ('plain', 'memory', 'speed', 'reversible', 'selective')
    """
    if not isinstance(source, str) or not source:
        raise ProfileError(f"expected a model name, a .keras file or module:function; received {source!r}")
    if source in BUILT_IN:
        return ModelSpec(source, "built-in", _STRATEGIES_OF[source], DEFAULT_DEPTHS[source],
                         DEFAULT_BATCH[source], width)
    if source.endswith(".keras"):
        if not os.path.isfile(source):
            raise ProfileError(f"model file {source!r} does not exist")
        return ModelSpec(source, "file", _USER_MODEL_STRATEGIES, (), 32)
    if source.count(":") == 1 and all(source.split(":")):
        return ModelSpec(source, "builder", _USER_MODEL_STRATEGIES, (), 32)
    raise ProfileError(
        f"unknown model {source!r}: expected one of {', '.join(BUILT_IN)}, a path ending in .keras, "
        "or a Python builder 'module:function'"
    )


def computes_in_half_precision(model) -> bool:
    """Whether a Keras ``model``, or a layer nested in it (through ``layers``), computes in
    float16 or bfloat16."""
    pending, seen = [model], set()
    while pending:
        layer = pending.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if str(getattr(layer, "compute_dtype", "")) in ("float16", "bfloat16"):
            return True
        pending.extend(getattr(layer, "layers", None) or [])
    return False


def check_strategies(spec: ModelSpec, strategies) -> tuple:
    """The requested strategies, or a `ProfileError` naming the ones the model lacks."""
    strategies = tuple(strategies)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ProfileError(f"unknown strategy {unknown[0]!r}: expected some of {', '.join(STRATEGIES)}")
    missing = [s for s in strategies if s not in spec.strategies]
    if missing:
        raise ProfileError(
            f"model {spec.source!r} has no {missing[0]!r} strategy; it supports {', '.join(spec.strategies)}"
        )
    return strategies


# ---------------------------------------------------------------------------------------------
# Models


def _coupling_blocks(depth, width, selective):
    from memgrad import layers as rev
    from memgrad import selective as sel

    half = width // 2

    def network(seed):
        init = keras.initializers.RandomNormal(stddev=1.0 / half**0.5, seed=seed)
        if selective:  # the same function; the ReLU keeps a 1-byte mask
            return keras.Sequential([sel.Dense(half, kernel_initializer=init), sel.ReLU()])
        return keras.layers.Dense(half, activation="relu", kernel_initializer=init)

    return [rev.AdditiveCoupling(network(2 * i), network(2 * i + 1)) for i in range(depth)]


class _CouplingModel(keras.Model):
    """``depth`` additive couplings on ``[batch, width]``: one network, every strategy."""

    def __init__(self, depth, width, strategy):
        super().__init__(name=f"coupling_{depth}x{width}")
        from memgrad import layers as rev

        if width < 2 or width % 2:
            raise ProfileError(f"the coupling model needs an even width >= 2; received {width}")
        self.blocks = _coupling_blocks(depth, width, selective=strategy == "selective")
        # The other strategies run the ordinary float32 network; the reversible stack carries its
        # activations in float64 (its default) so that its gradients match that network's.
        reversible = strategy == "reversible"
        self.stack = rev.ReversibleSequence(self.blocks, plain_backprop=not reversible,
                                            invertible_dtype="auto" if reversible else "float32", name="couplings")
        self.stack.build((None, width))

    def call(self, x, training=None):
        return self.stack(x, training=training)


def _load_keras_file(path):
    unreadable = f"model file {path!r} exists but is not a readable Keras model"
    # Keras reports a file that is not a zip archive (random bytes, a truncated download) as
    # "File not found", so open it here first to name the real problem.
    try:
        zipfile.ZipFile(path).close()
    except FileNotFoundError:
        raise ProfileError(f"model file {path!r} does not exist") from None
    except OSError as error:  # e.g. no permission to read it
        raise ProfileError(f"cannot read model file {path!r}: {error.strerror or error}") from None
    except zipfile.BadZipFile as error:
        raise ProfileError(f"{unreadable}: {error} (a .keras file is the zip archive model.save writes)") from None
    try:
        return keras.saving.load_model(path, safe_mode=True, compile=False)
    except Exception as error:  # noqa: BLE001 - any failure to load is the user's file
        # str(KeyError) wraps its message in quotes ("There is no item named 'config.json' ...").
        message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        reason = message.strip().splitlines()[0] if message.strip() else type(error).__name__
        raise ProfileError(f"{unreadable}: {reason[:300]}") from None


def _call_builder(source, depth):
    module_name, function_name = source.split(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ProfileError(f"cannot import builder {source!r}: {error}") from None
    try:
        model = function(depth=depth) if depth is not None else function()
    except TypeError as error:
        raise ProfileError(f"builder {source!r} failed: {error}") from None
    if not isinstance(model, keras.Model):
        raise ProfileError(f"builder {source!r} must return a keras.Model; it returned {type(model).__name__}")
    return model


def build_model(spec: ModelSpec, strategy: str, depth):
    """Builds the Keras model ``spec`` describes, in the form ``strategy`` trains.

    Args:
      spec: a `ModelSpec`.
      strategy: one of ``spec.strategies``.
      depth: the depth (``None`` for a model without one).

    Returns:
      A built ``keras.Model``; for ``selective`` already converted with `memgrad.selective.convert`.

    Raises:
      ProfileError: if the model cannot be built (bad depth, unreadable file, ...).
    """
    try:
        model = _build(spec, strategy, depth)
    except ProfileError:
        raise
    except ValueError as error:  # the builders' own checks, e.g. an unsupported depth
        raise ProfileError(f"{spec.source} at depth {depth}: {str(error).splitlines()[0]}") from None
    if strategy == "selective" and spec.source != "coupling":
        import memgrad

        try:
            model = memgrad.selective.convert(model)
        except ValueError as error:
            raise ProfileError(f"the selective strategy cannot convert {spec.source!r}: {error}") from None
    return model


def _build(spec, strategy, depth):
    if spec.kind == "file":
        return _load_keras_file(spec.source)
    if spec.kind == "builder":
        return _call_builder(spec.source, depth)
    name = spec.source
    if name == "coupling":
        return _CouplingModel(depth, spec.width, strategy)
    if name == "resnet":
        from memgrad_zoo.resnet import resnet

        return resnet(depth, input_shape=IMAGE_SHAPE)
    if name == "revnet":
        from memgrad_zoo.revnet import revnet

        return revnet(depth, input_shape=IMAGE_SHAPE, reversible=strategy == "reversible")
    if name == "densenet":
        from memgrad_zoo.densenet import densenet_bc

        return densenet_bc(depth, 12, efficient=False, input_shape=IMAGE_SHAPE)
    try:
        from memgrad_zoo.glow import Glow
    except ImportError as error:  # Glow's prior is a TFP distribution
        raise ProfileError(f"the zoo's glow needs the [zoo] extra: pip install 'memgrad[zoo]'. "
                           f"Received: {error}") from None

    glow = Glow(IMAGE_SHAPE, levels=1, steps=depth, hidden=32, reversible=strategy == "reversible")
    glow.build()
    return glow


def input_batch(model, batch_size, spec: ModelSpec):
    """Synthetic inputs for ``model``: a tuple of tensors with a leading ``batch_size``."""
    if spec.source in ("coupling", "glow"):
        shapes = [(None, spec.width) if spec.source == "coupling" else (None, *IMAGE_SHAPE)]
        dtypes = ["float32"]
    else:
        inputs = getattr(model, "inputs", None)
        if not inputs:
            raise ProfileError(f"model {spec.source!r} has no known inputs (build it, or use a functional model)")
        shapes = [tuple(t.shape) for t in inputs]
        dtypes = [t.dtype for t in inputs]
    batch = []
    for i, shape in enumerate(shapes):
        if any(d is None for d in shape[1:]):
            raise ProfileError(f"model {spec.source!r} input {i} has an unknown dimension {shape}; "
                               "the profiler needs fixed shapes besides the batch")
        dtype = tf.as_dtype(dtypes[i])
        full = [batch_size, *shape[1:]]
        if dtype.is_integer:
            batch.append(tf.zeros(full, dtype))
        else:
            value = tf.random.stateless_uniform(full, seed=[7, i], minval=-0.5, maxval=0.5)
            batch.append(tf.cast(value, dtype))
    return tuple(batch)


def training_step(model, strategy):
    """A ``tf.function`` running one SGD step of ``model`` with ``strategy``'s gradients.

    Args:
      model: a built Keras model (for ``selective``, already converted).
      strategy: one of `STRATEGIES`.

    Returns:
      ``step(*inputs) -> loss``.

    Example:
      >>> spec = model_spec("coupling", width=64)
      >>> step = training_step(build_model(spec, "memory", depth=8), "memory")
      >>> loss = step(*input_batch(None, 32, spec))
    """
    import memgrad

    variables = model.trainable_variables
    if not variables:
        raise ProfileError(f"model {model.name!r} has no trainable weights: there is nothing to train")

    def tape():
        if strategy in ("memory", "speed"):
            return memgrad.GradientTape(checkpoints=strategy)
        return tf.GradientTape()

    @tf.function(autograph=False)
    def step(*inputs):
        with tape() as t:
            outputs = model(inputs[0] if len(inputs) == 1 else list(inputs), training=True)
            loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(o, tf.float32))) for o in tf.nest.flatten(outputs)])
        grads = t.gradient(loss, variables)
        for variable, grad in zip(variables, grads):
            if grad is not None:
                variable.assign_sub(1e-4 * tf.cast(grad, variable.dtype))
        return loss

    return step


def workload(spec: ModelSpec, strategy, depth, batch_size):
    """One point of a sweep.

    Args:
      spec: a `ModelSpec`.
      strategy: one of ``spec.strategies``.
      depth: the depth, or ``None``.
      batch_size: the batch size.

    Returns:
      ``(step, inputs, model)``: the training step, its synthetic inputs and the model.

    Example:
      >>> import memgrad
      >>> step, inputs, _ = workload(model_spec("coupling", width=64), "reversible", 16, 32)
      >>> report = memgrad.profiler.measure(step, args=inputs)
    """
    model = build_model(spec, strategy, depth)
    return training_step(model, strategy), input_batch(model, batch_size, spec), model


def capped_step(source, strategy, depth, batch_size, width=256, steps=1):
    """Builds one workload and runs ``steps`` training steps: the `run_capped` target of ``--budget``.

    Args:
      source: the model, as for `model_spec`.
      strategy: one of `STRATEGIES`.
      depth: the depth (``0``/``None`` for none).
      batch_size: the batch size.
      width: the coupling model's width.
      steps: training steps to run (the first traces; later ones allocate no more).
    """
    spec = model_spec(source, width=width)
    step, inputs, _ = workload(spec, strategy, depth or None, batch_size)
    for _ in range(steps):
        step(*inputs)


def release():
    """Frees what a finished workload left behind before the next one is measured."""
    gc.collect()
