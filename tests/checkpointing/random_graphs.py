"""Random differentiable graphs, and the check that memgrad differentiates them like TensorFlow.

Shared by the hypothesis property test (tests/checkpointing/test_properties.py) and the
long fuzz run (scripts/fuzz.py). A graph is described by a `GraphSpec`, a small plain
value drawn through a `Chooser`: `RandomChooser` (a seeded `random.Random`, for the script)
or `HypothesisChooser` (hypothesis's `data.draw`, so failures shrink). `check_graph` builds
the graph, traces ONE `tf.function` in which the forward pass runs once, and differentiates
that same forward with `tf.gradients` / `tf.GradientTape` (the references) and with every
memgrad strategy; it returns per-strategy outcomes instead of raising, so the script can
count them.

Shape of a graph: an image input `[4, 6, 6, 4]`, 0-2 convolution layers, a flatten +
dense projection to width 16, then 5-6 dense-stage layers (dense, residual, elementwise,
long skips, concat/split, batch normalisation, seeded dropout, tf.cond, embeddings; with
`draw_spec(..., loops=True)` also loops: tf.scan, tf.foldl, tf.map_fn, tf.while_loop over a
TensorArray or a data-dependent number of steps, Keras SimpleRNN/GRU/LSTM, a scan inside a
nested tf.function or a tf.cond, a loop nested in a loop), and a loss (sum of squares,
softmax cross-entropy, or two ys). xs are the variables used, plus optionally intermediate
tensors, the input, and a variable nothing depends on.

Not drawn, on purpose: a stop_gradient on the output of a nested tf.function holding a
loop (tf.gradients itself then fails at run time: NOT_FOUND: SymbolicGradient), two
stop_gradients of which one is an x (out of scope:
`stop_gradients=[x, f(x)]` with x in xs gives total derivatives), and a batch
normalisation that would cancel a parameter's shift or scale (`_carries_shift`: that
parameter's gradient is float noise, not a memgrad result).
"""

import contextlib
import dataclasses
import random
import traceback

import keras
import numpy as np
import tensorflow as tf

import memgrad
from tests.checkpointing.models import max_relative_error

BATCH, SIDE, CHANNELS, WIDTH, VOCAB, TOKENS, CLASSES = 4, 6, 4, 16, 10, 3, 5
TOLERANCE = 1e-5
# The dtypes drawn with `draw_spec(chooser, dtypes=True)`: a graph computes in float32, in
# float64, or under a Keras mixed-precision policy (float32 variables, every op in float16 or
# bfloat16, the loss in float32). memgrad's gradient is compared with tf.gradients of the
# same graph in the same dtype, within the dtype's tolerance: recomputation repeats the same
# ops, but a gradient summed in another order rounds differently.
DTYPES = ("float32", "float64", "mixed_float16", "mixed_bfloat16")
TOLERANCES = {"float32": TOLERANCE, "float64": 1e-10, "mixed_float16": 1e-2,
              "mixed_bfloat16": 5e-2}
MIN_DENSE_LAYERS, MAX_DENSE_LAYERS = 5, 6

CONV_KINDS = ("conv", "conv_residual", "conv_bn")
DENSE_KINDS = (
    "dense", "residual", "elementwise", "skip", "concat_split", "moments_bn", "keras_bn",
    "dropout", "cond_fixed", "cond_data", "embedding",
)
# Loops, drawn with `draw_spec(chooser, loops=True)`: each is one While (or more) in the
# forward pass, whose gradient memgrad builds in segments of steps or replays whole.
LOOP_KINDS = (
    "scan", "foldl", "map_fn", "while_ta", "while_data", "rnn", "nested_function",
    "loop_in_cond", "nested_loop",
)
# Gradients inside the forward pass, drawn with `draw_spec(chooser, higher=True)` (one layer,
# appended last): a tf.cond branch or a while loop's body takes memgrad.gradients of a local
# loss, with respect to a tensor of its own ('local': the rewrite's case) or to one the
# enclosing graph computed ('outer': plain tf.gradients with a warning), and steps down it.
HIGHER_KINDS = ("grad_in_cond", "grad_in_loop")
LOOP_STEPS = (3, 9, 16)  # under 8 steps a loop is replayed whole; from 8 on, in segments
RNN_CLASSES = ("SimpleRNN", "GRU", "LSTM")
ACTIVATIONS = ("tanh", "relu", "sigmoid", "none")
ELEMENTWISE = ("swish", "tanh_add", "relu_mul", "square_scaled")
LOSSES = ("squares", "xent", "two_ys")
TAPE_CHECKPOINTS = ("memory", "speed")
BUDGET_FRACTIONS = (0.4, 0.6, 0.8, 1.0)


# ---------------------------------------------------------------------- choosers
class RandomChooser:
    """Draws from a seeded `random.Random` (reproducible from the seed alone)."""

    def __init__(self, seed):
        self._rng = random.Random(seed)

    def integer(self, lo, hi):
        return self._rng.randint(lo, hi)

    def choice(self, options):
        return options[self._rng.randrange(len(options))]


class HypothesisChooser:
    """Draws through hypothesis's `data.draw`, so a failing graph shrinks to a small one."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self._data, self._st = data, st

    def integer(self, lo, hi):
        return self._data.draw(self._st.integers(lo, hi))

    def choice(self, options):
        return self._data.draw(self._st.sampled_from(options))


def _distinct(chooser, candidates, count):
    """Up to `count` distinct elements of `candidates`, in increasing order."""
    pool, picked = list(candidates), []
    for _ in range(min(count, len(pool))):
        picked.append(pool.pop(chooser.integer(0, len(pool) - 1)))
    return sorted(picked)


# ---------------------------------------------------------------------- the spec
@dataclasses.dataclass
class GraphSpec:
    """A random graph and how it is differentiated; plain data, printable as a repro.

    Records (the tensors `records[i]` the layers produce, in order) are indexed across the
    whole graph: the convolution outputs, the flatten projection, then the dense layers.

    Attributes:
      seed: seeds the variables' initial values, the inputs and the dropout masks.
      conv: kinds of the convolution layers (`CONV_KINDS`).
      layers: `(kind, argument)` of the dense-stage layers; the argument is an activation,
        an elementwise formula, the record a skip adds, a cond predicate, or None.
      loss: one of `LOSSES`; `two_ys` adds an auxiliary loss on record `aux`.
      aux: the record the auxiliary loss of `two_ys` reads.
      x_records: records differentiated as xs (intermediate tensors).
      x_input: whether the input image is an x.
      unconnected: `'none'` or `'zero'`; an x nothing depends on is added when
        `x_unconnected`.
      stops: records passed as `stop_gradients` (never two stops when one is an x).
      list_checkpoints: records for `checkpoints=[...]`.
      budget: the fraction for `memgrad.strategies.Budget`.
      tape_checkpoints: the strategy of `memgrad.GradientTape`.
      plain_tape: whether a `tf.GradientTape` records the forward too (the reference of
        memgrad's tape; else tf.gradients without stops is).
      dtype: one of `DTYPES`, what the graph computes in.
      second_order: every strategy's gradient is differentiated again, by the same strategy
        (the gradient of half its squared norm), against tf.gradients of tf.gradients.
      inner_checkpoints: the strategy of the memgrad.gradients call inside a
        `HIGHER_KINDS` layer.
    """

    seed: int
    conv: list
    layers: list
    loss: str
    aux: int
    x_records: list
    x_input: bool
    x_unconnected: bool
    unconnected: str
    stops: list
    list_checkpoints: list
    budget: float
    tape_checkpoints: str
    plain_tape: bool
    dtype: str = "float32"
    second_order: bool = False
    inner_checkpoints: str = "memory"

    @property
    def tolerance(self):
        """The largest relative error accepted between memgrad's and TensorFlow's gradients."""
        return TOLERANCES[self.dtype]

    @property
    def records(self):
        return len(self.conv) + 1 + len(self.layers)

    def describe(self):
        """A one-screen description: enough to rebuild the graph with `GraphSpec(**...)`."""
        return repr(dataclasses.asdict(self))


NORMALISATIONS = ("moments_bn", "keras_bn")


def _carries_shift(layers, record, first_dense):
    """Does `record` hold a per-feature shift by a parameter, reached through linear maps?

    A bias of a dense layer without activation, or a normalisation's beta, carried to a
    batch normalisation by additions (skips, embeddings) and linear layers only, is
    cancelled by it (and a normalisation's gamma by a second one). Their gradients are
    then zero in exact arithmetic and, in float32, rounding noise of the BN gradient's
    cancellation (about 6e-8 for gradients of order 0.5 at batch 4): above the 1e-5
    tolerance under max_relative_error's 1% floor. Not a memgrad bug, so the generator
    does not draw a normalisation there.
    """
    k = record - first_dense - 1  # the dense-stage layer that made the record
    if k < 0:
        return False  # a convolution or the flatten projection: nonlinear outputs
    kind, argument = layers[k]
    if kind in NORMALISATIONS or (kind == "dense" and argument == "none"):
        return True
    if kind == "skip":
        return (_carries_shift(layers, record - 1, first_dense)
                or _carries_shift(layers, argument, first_dense))
    if kind == "embedding" or (kind == "residual" and argument == "none"):
        return _carries_shift(layers, record - 1, first_dense)
    return False


def _loop_argument(chooser, kind):
    if kind in ("scan", "foldl", "while_ta", "nested_function"):
        return chooser.choice(LOOP_STEPS)
    if kind == "rnn":
        return chooser.choice(RNN_CLASSES)
    if kind == "loop_in_cond":
        return chooser.choice((True, False, None))  # a fixed predicate, or the data's
    return None


def draw_spec(chooser, loops=False, dtypes=False, higher=False):
    """Draws a `GraphSpec` through `chooser` (a `RandomChooser` or `HypothesisChooser`).

    With ``loops``, dense-stage layers are drawn from `LOOP_KINDS` too, and one of them,
    at least, is a loop. With ``dtypes``, the graph's dtype is drawn from `DTYPES` (else it
    is float32); it is drawn last, so the rest of a seed's graph is the same either way.
    With ``higher`` (drawn after that), a `HIGHER_KINDS` layer is appended, or the graph is
    differentiated twice (`second_order`), or both.
    """
    seed = chooser.integer(0, 2**16)
    conv = []
    for _ in range(chooser.integer(0, 2)):
        kind = chooser.choice(CONV_KINDS)
        conv.append("conv" if kind == "conv_bn" and conv[-1:] == ["conv_bn"] else kind)
    first_dense = len(conv)  # the flatten projection's record
    layers = []
    count = chooser.integer(MIN_DENSE_LAYERS, MAX_DENSE_LAYERS)
    loop_at = chooser.integer(0, count - 1) if loops else None
    for i in range(count):
        if i == loop_at:
            kind = chooser.choice(LOOP_KINDS)
        else:
            kind = chooser.choice(DENSE_KINDS + (LOOP_KINDS if loops else ()))
        argument = _loop_argument(chooser, kind)
        if kind in ("dense", "residual"):
            argument = chooser.choice(ACTIVATIONS)
        elif kind == "elementwise":
            argument = chooser.choice(ELEMENTWISE)
        elif kind == "skip":
            # Any earlier dense-stage record: usually several layers back (a long skip).
            argument = chooser.integer(first_dense, first_dense + i)
        elif kind == "cond_fixed":
            argument = chooser.choice((True, False))
        if kind in NORMALISATIONS and _carries_shift(layers, first_dense + i, first_dense):
            kind, argument = "elementwise", "swish"
        layers.append((kind, argument))
    records = len(conv) + 1 + len(layers)
    loss = chooser.choice(LOSSES)
    aux = chooser.integer(first_dense, records - 1)
    x_records = _distinct(chooser, range(records), chooser.integer(0, 2))
    # Stops in the first half only, so the second half has gradients to rewrite; two stops
    # never include an x (out of scope: stop_gradients=[x, f(x)] with x in xs is out of scope).
    half = range(max(1, records // 2))
    count = chooser.integer(0, 2) if chooser.integer(0, 2) == 0 else 0  # a third of graphs
    stops = _distinct(chooser, half, count)
    if len(stops) > 1:
        stops = [s for s in stops if s not in x_records]
    # TensorFlow's own tf.gradients fails at run time (NOT_FOUND: SymbolicGradient) with a
    # stop on the output of a nested tf.function holding a loop: not a memgrad case.
    stops = [s for s in stops if s <= first_dense or layers[s - first_dense - 1][0] !=
             "nested_function"]
    after = max(stops, default=-1) + 1
    list_checkpoints = _distinct(chooser, range(after, records), chooser.integer(1, 3))
    spec = GraphSpec(
        seed=seed, conv=conv, layers=layers, loss=loss, aux=aux, x_records=x_records,
        x_input=bool(chooser.integer(0, 1)), x_unconnected=bool(chooser.integer(0, 1)),
        unconnected=chooser.choice(("none", "zero")), stops=stops,
        list_checkpoints=list_checkpoints, budget=chooser.choice(BUDGET_FRACTIONS),
        tape_checkpoints=chooser.choice(TAPE_CHECKPOINTS),
        plain_tape=bool(chooser.integer(0, 1)),
    )
    if dtypes:
        spec.dtype = chooser.choice(DTYPES)
    if higher:
        kind = chooser.choice(HIGHER_KINDS + (None,))
        if kind is not None:
            spec.layers.append((kind, chooser.choice(("local", "outer"))))
            spec.inner_checkpoints = chooser.choice(TAPE_CHECKPOINTS)
        spec.second_order = kind is None or bool(chooser.integer(0, 1))
    return spec


# ---------------------------------------------------------------------- the graph
def _activation(name, h):
    return {"tanh": tf.tanh, "relu": tf.nn.relu, "sigmoid": tf.sigmoid,
            "none": tf.identity}[name](h)


def _elementwise(name, h):
    if name == "swish":
        return h * tf.sigmoid(h)
    if name == "tanh_add":
        return tf.tanh(h) + 0.5 * h
    if name == "relu_mul":
        return tf.nn.relu(h) * tf.tanh(h) + h
    return 0.25 * h * h + h  # square_scaled


class RandomGraph:
    """The forward pass of a `GraphSpec`, with its variables and inputs.

    Variables are created by one eager run of the forward pass (`_var` creates on first
    use), so tracing inside `tf.function` only reads them.
    """

    def __init__(self, spec, dtype=None):
        self.spec = spec
        # `dtype` overrides the spec's: float64 gives the exact-arithmetic reference.
        self.policy = keras.DTypePolicy(dtype or spec.dtype)
        self.dtype = tf.as_dtype(self.policy.compute_dtype)  # what the ops compute in
        self.variable_dtype = tf.as_dtype(self.policy.variable_dtype)
        self._rng = np.random.default_rng(spec.seed)
        self._variables = {}
        self._keras = {}
        self._functions = {}  # the inner tf.functions of `nested_function` layers
        self.inner_plain = False  # `HIGHER_KINDS` layers: tf.gradients instead of memgrad
        self.unused = tf.Variable(tf.ones([3], self.variable_dtype), name="unconnected")
        rng = np.random.default_rng(spec.seed + 1)
        image = rng.standard_normal((BATCH, SIDE, SIDE, CHANNELS)).astype("float32")
        self.x = tf.constant(image, self.dtype)
        self.ids = tf.constant(rng.integers(0, VOCAB, (BATCH, TOKENS)), tf.int32)
        self.labels = tf.constant(rng.integers(0, CLASSES, (BATCH,)), tf.int32)
        self.forward(self.x, self.ids, self.labels)  # creates the variables

    def _var(self, name, shape, scale=None, offset=0.0):
        """The variable `name` as the ops use it: cast to the compute dtype under a
        mixed-precision policy, as Keras layers do."""
        if name not in self._variables:
            fan_in = int(np.prod(shape[:-1])) or 1
            scale = 1.0 / np.sqrt(fan_in) if scale is None else scale
            value = offset + scale * self._rng.standard_normal(shape)
            self._variables[name] = tf.Variable(
                # Rounded to float32 first: a float64 graph has the float32 one's values.
                value.astype("float32").astype(self.variable_dtype.as_numpy_dtype), name=name)
        variable = self._variables[name]
        return variable if variable.dtype == self.dtype else tf.cast(variable, self.dtype)

    def _keras_bn(self, name):
        if name not in self._keras:
            self._keras[name] = keras.layers.BatchNormalization(
                name=name, dtype=self.policy.name)
        return self._keras[name]

    def _keras_rnn(self, name, kind):
        if name not in self._keras:
            keras.utils.set_random_seed(self.spec.seed)
            self._keras[name] = getattr(keras.layers, kind)(
                WIDTH, name=name, dtype=self.policy.name)
        return self._keras[name]

    @property
    def variables(self):
        """Every trainable variable the forward pass uses, in creation order."""
        keras_vars = [v for layer in self._keras.values() for v in layer.trainable_variables]
        return list(self._variables.values()) + keras_vars

    def forward(self, x, ids, labels):
        """Runs the forward pass; returns `(ys, records)`."""
        spec, records = self.spec, []
        h = x
        for i, kind in enumerate(spec.conv):
            kernel = self._var(f"conv{i}", [3, 3, CHANNELS, CHANNELS])
            z = tf.nn.conv2d(h, kernel, 1, "SAME")
            if kind == "conv":
                h = tf.nn.relu(z + self._var(f"conv{i}_b", [CHANNELS], 0.1))
            elif kind == "conv_residual":
                h = h + tf.tanh(z)
            else:  # conv_bn
                mean, var = tf.nn.moments(z, [0, 1, 2])
                h = tf.nn.relu(tf.nn.batch_normalization(
                    z, mean, var, self._var(f"conv{i}_beta", [CHANNELS], 0.1),
                    self._var(f"conv{i}_gamma", [CHANNELS], 0.1, 1.0), 1e-3))
            records.append(h)
        flat = tf.reshape(h, [BATCH, SIDE * SIDE * CHANNELS])
        h = tf.tanh(flat @ self._var("flatten", [SIDE * SIDE * CHANNELS, WIDTH]))
        records.append(h)
        for i, (kind, argument) in enumerate(spec.layers):
            h = self._layer(i, kind, argument, h, ids, records)
            records.append(h)
        ys = self._loss(h, labels, records)
        return ys, records

    def _layer(self, i, kind, argument, h, ids, records):
        name = f"l{i}"
        if kind == "dense":
            return _activation(argument, h @ self._var(name, [WIDTH, WIDTH])
                               + self._var(name + "_b", [WIDTH], 0.1))
        if kind == "residual":
            return h + _activation(argument, h @ self._var(name, [WIDTH, WIDTH]))
        if kind == "elementwise":
            return _elementwise(argument, h)
        if kind == "skip":
            return h + records[argument]
        if kind == "concat_split":
            z = tf.concat([h, tf.tanh(h)], axis=-1) @ self._var(name, [2 * WIDTH, 2 * WIDTH])
            a, b = tf.split(z, 2, axis=-1)
            return a * tf.sigmoid(b)
        if kind == "moments_bn":
            mean, var = tf.nn.moments(h, [0])
            return tf.nn.batch_normalization(
                h, mean, var, self._var(name + "_beta", [WIDTH], 0.1),
                self._var(name + "_gamma", [WIDTH], 0.1, 1.0), 1e-3)
        if kind == "keras_bn":
            return self._keras_bn(f"{name}_keras_bn")(h, training=True)
        if kind == "dropout":
            # A stateless mask: recomputing it gives the same mask, as memgrad requires.
            keep = tf.random.stateless_uniform([BATCH, WIDTH], [self.spec.seed, i]) >= 0.3
            return h * tf.cast(keep, h.dtype) / 0.7
        if kind in ("cond_fixed", "cond_data"):
            w = self._var(name, [WIDTH, WIDTH])
            v = self._var(name + "_else", [WIDTH], 0.5)
            pred = tf.constant(argument) if kind == "cond_fixed" else tf.reduce_mean(h) > 0.0
            return tf.cond(pred, lambda: tf.tanh(h @ w), lambda: tf.nn.relu(h) * v)
        if kind == "embedding":
            table = self._var(name, [VOCAB, WIDTH], 0.5)
            return h + tf.tanh(tf.reduce_mean(tf.gather(table, ids), axis=1))
        if kind in LOOP_KINDS:
            return self._loop(name, kind, argument, h)
        if kind in HIGHER_KINDS:
            return self._inner_gradient(name, kind, argument, h)
        raise ValueError(f"unknown layer kind {kind!r}")

    def _inner_gradient(self, name, kind, argument, h):
        """A gradient step taken inside a branch or a loop body (`HIGHER_KINDS`); with
        `inner_plain` set, by tf.gradients (the same forward, TensorFlow's gradient)."""
        w = self._var(name, [WIDTH, WIDTH], 0.5)

        def descend(c):
            if argument == "local":
                loss, source = tf.reduce_sum(tf.tanh(c @ w) ** 2), c
            else:  # with respect to h, computed outside the branch or the loop
                loss, source = tf.reduce_sum(tf.tanh(c @ w) * h), h
            if tf.executing_eagerly():  # the run that creates the variables
                step = tf.zeros_like(source)
            elif self.inner_plain:
                step = tf.gradients(loss, source)[0]
            else:
                step = memgrad.gradients(loss, source,
                                         checkpoints=self.spec.inner_checkpoints)[0]
            return c - 0.1 * step

        if kind == "grad_in_cond":
            # Data-dependent, but not at rounding's edge: "inner" compares two forwards
            # whose sums round differently, and the mean of a batch-normalised h is 0 up
            # to rounding (a predicate on its sign took different branches in the two).
            return tf.cond(tf.reduce_mean(tf.abs(h)) > 1e-3, lambda: descend(h * 1.0),
                           lambda: tf.nn.relu(h))
        return tf.while_loop(lambda i, c: i < 3, lambda i, c: (i + 1, descend(c)), (0, h))[1]

    def _sequence(self, name, h, steps):
        """`[steps, BATCH, WIDTH]` inputs of a loop over time, each step a function of h."""
        scale = self._var(name + "_time", [steps, 1, WIDTH], 0.5, 1.0)
        return tf.tanh(h[None] * scale)

    def _cell(self, name):
        w = self._var(name, [WIDTH, WIDTH], 0.5)
        return lambda c, x_t: tf.tanh(c @ w + x_t)

    def _loop(self, name, kind, argument, h):
        if kind == "scan":
            states = tf.scan(self._cell(name), self._sequence(name, h, argument), initializer=h)
            return states[-1] + 0.5 * tf.reduce_mean(states, axis=0)
        if kind == "foldl":
            return tf.foldl(self._cell(name), self._sequence(name, h, argument), initializer=h)
        if kind == "map_fn":
            w = self._var(name, [WIDTH, WIDTH])
            return tf.map_fn(lambda row: tf.tanh(row[None] @ w)[0] + row, h)
        if kind == "while_ta":
            cell, inputs = self._cell(name), self._sequence(name, h, argument)
            written = tf.TensorArray(self.dtype, size=argument)

            def body(i, c, written):
                c = cell(c, inputs[i])
                return i + 1, c, written.write(i, c)

            _, c, written = tf.while_loop(lambda i, c, w: i < argument, body, (0, h, written))
            return c + tf.reduce_mean(tf.sin(written.stack()), axis=0)
        if kind == "while_data":
            # Steps while the state stays small: how many depends on the data (at most 12).
            cell, bias = self._cell(name), self._var(name + "_b", [WIDTH], 0.3, 0.3)
            _, c = tf.while_loop(
                lambda i, c: tf.logical_and(i < 12, tf.reduce_mean(c * c) < 0.5),
                lambda i, c: (i + 1, cell(c, bias) * 1.2), (0, h))
            return c
        if kind == "rnn":
            sequence = tf.reshape(h, [BATCH, 4, WIDTH // 4])
            return self._keras_rnn(name + "_" + argument.lower(), argument)(
                sequence, training=True) + h
        if kind == "nested_function":
            if name not in self._functions:
                cell = self._cell(name)
                self._functions[name] = tf.function(
                    lambda h, inputs: tf.scan(cell, inputs, initializer=h)[-1], autograph=False)
            return self._functions[name](h, self._sequence(name, h, argument))
        if kind == "loop_in_cond":
            v = self._var(name + "_else", [WIDTH], 0.5)
            pred = tf.constant(argument) if argument is not None else tf.reduce_mean(h) > 0.0
            return tf.cond(pred, lambda: self._loop(name, "scan", 9, h),
                           lambda: tf.nn.relu(h) * v)
        if kind == "nested_loop":
            w = self._var(name, [WIDTH, WIDTH], 0.5)
            steps = tf.cast(tf.range(1.0, 4.0), self.dtype)  # no float16 Range kernel

            def outer(c, x_t):
                return tf.foldl(lambda d, k: tf.tanh(d @ w + k * x_t), steps, initializer=c)

            return tf.scan(outer, self._sequence(name, h, 9), initializer=h)[-1]
        raise ValueError(f"unknown loop kind {kind!r}")

    def _loss(self, h, labels, records):
        kind = self.spec.loss
        # Always a dense head first: the sum of squares of a batch-normalised tensor is
        # nearly constant, so every gradient upstream of it would be rounding noise.
        # In float32 under a mixed-precision policy, as Keras computes a model's loss.
        logits = tf.cast(h @ self._var("head", [WIDTH, CLASSES]), self.variable_dtype)
        if kind == "squares":
            return [tf.reduce_sum(logits * logits)]
        xent = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        if kind == "xent":
            return [xent]
        aux = tf.cast(records[self.spec.aux], self.variable_dtype)
        return [xent, 0.1 * tf.reduce_sum(tf.square(tf.tanh(aux)))]


# ---------------------------------------------------------------------- the check
@dataclasses.dataclass
class Outcome:
    """What one strategy gave on one graph.

    `status` is one of `ok`, `wrong` (a gradient differs, or its None-ness), `crash`
    (memgrad raised, or the traced function failed), `fallback` (plain tf.gradients ran,
    or fewer than two segments: the rewrite was not tested), `budget_error` (no plan fits
    the budget; legitimate), `budget_plain` (plain backprop fits the budget; legitimate),
    `speed_plain` ('speed' would free under 5% of what plain backprop keeps, so plain
    backprop runs; legitimate),
    `cut_plain` (one segment, on a graph whose stop_gradients cut every path from the
    input: the strategy's checkpoints all lie where no gradient flows; legitimate),
    `noise` (over the tolerance, but as close to the float64 gradient as tf.gradients is:
    see `_triage`).
    A budget that raised BudgetError is retried at the smallest feasible budget; its
    outcome is then that of the retry, with `budget_error` set.
    """

    strategy: str
    status: str
    error: float = 0.0
    detail: str = ""
    budget_error: bool = False  # the budget raised BudgetError and was retried


# `hang`: scripts/fuzz.py's status for a graph with no result within its --timeout.
FAILURES = ("wrong", "crash", "fallback", "hang")


@dataclasses.dataclass
class GraphResult:
    spec: GraphSpec
    outcomes: list

    @property
    def failures(self):
        return [o for o in self.outcomes if o.status in FAILURES]

    def report(self):
        lines = [f"graph: {self.spec.describe()}"]
        for o in self.outcomes:
            lines.append(f"  {o.strategy:>8}: {o.status} error={o.error:.3g} {o.detail}")
        return "\n".join(lines)


def _dense(g):
    """A gradient as a float64 array (exact for every dtype drawn), or None."""
    return None if g is None else tf.convert_to_tensor(g).numpy().astype(np.float64)


def compare(reference, other, tolerance=TOLERANCE):
    """(max relative error, problem or '') between two gradient lists.

    None-ness must match position by position; IndexedSlices are densified; the error is
    `max_relative_error` over the non-None pairs (inf for a shape mismatch, or for
    non-finite entries where the reference's are finite or the other way round).
    """
    if len(reference) != len(other):
        return float("inf"), f"{len(other)} gradients for {len(reference)} xs"
    pairs, positions = [], []
    for i, (a, b) in enumerate(zip(reference, other)):
        if (a is None) != (b is None):
            return float("inf"), f"x {i}: reference {'None' if a is None else 'a tensor'}, " \
                                 f"memgrad {'None' if b is None else 'a tensor'}"
        if a is not None:
            a, b = _dense(a), _dense(b)
            if a.shape != b.shape:
                return float("inf"), f"x {i}: shape {b.shape}, expected {a.shape}"
            finite = np.isfinite(b)
            if not finite.all() or not np.isfinite(a).all():
                # A reduced-precision second derivative can overflow in tf.gradients too:
                # memgrad's must then be non-finite at the same entries; the rest is compared.
                if not np.array_equal(np.isfinite(a), finite):
                    return float("inf"), (f"x {i}: non-finite gradient at "
                                          f"{int(np.sum(np.isfinite(a) & ~finite))} entries where "
                                          f"the reference is finite, finite at "
                                          f"{int(np.sum(~np.isfinite(a) & finite))} where it is not")
                a, b = np.where(finite, a, 0.0), np.where(finite, b, 0.0)
            pairs.append((a, b))
            positions.append(i)
    if not pairs or all(not np.abs(a).max() for a, _ in pairs if a.size):
        # All zero (unconnected 'zero'): the pairs must then be exactly equal.
        worst = max((float(np.abs(a - b).max()) for a, b in pairs if a.size), default=0.0)
        return worst, ""
    error = max_relative_error([a for a, _ in pairs], [b for _, b in pairs])
    if error <= tolerance:
        return error, ""
    # Name the worst x (the scale rule of max_relative_error) to start minimising from.
    overall = max(float(np.abs(a).max()) for a, _ in pairs if a.size)
    worst = max(range(len(pairs)), key=lambda k: float(np.abs(pairs[k][0] - pairs[k][1]).max())
                / max(float(np.abs(pairs[k][0]).max()), 1e-2 * overall, 1e-30))
    a = pairs[worst][0]
    return error, f"worst: x {positions[worst]} (shape {a.shape}, max|g| {np.abs(a).max():.3g})"


def strategies_of(spec):
    """`(name, checkpoints)` for the memgrad.gradients strategies checked on `spec`."""
    # The budget plans on the memory model alone: the fuzz checks that a plan's rewrite
    # differentiates correctly, whichever plan it is; simulating each of hundreds of graphs
    # (Grappler, up to five rewrites per call) would multiply its time. The simulating
    # default is checked for gradients in test_parity.py and for memory in test_budget.py.
    return [("memory", "memory"), ("speed", "speed"), ("list", "list"),
            ("budget", memgrad.strategies.Budget(spec.budget, margin=0.0, measure=False, simulate=False))]


def _call(log, name, function, retry=None):
    """Runs one memgrad call at trace time; records its `memgrad.RewriteRecord` entries or its error.

    On a BudgetError, `retry(error)` (if given) makes the call again, and the error is
    noted in `log[name + ':budget_error']`.
    """
    try:
        with memgrad.record_rewrites() as entries:
            result = function()
    except memgrad.BudgetError as error:
        if retry is not None:
            log[name + ":budget_error"] = str(error)
            return _call(log, name, lambda: retry(error))
        log[name] = ("budget_error", str(error).splitlines()[0])
        return None
    except Exception:  # noqa: BLE001  (any exception from memgrad is a finding)
        log[name] = ("crash", traceback.format_exc(limit=-8))
        return None
    log[name] = ("entries", entries)
    return result


def _smallest_budget(error):
    """After a BudgetError on a tiny graph (usual: the fixed costs of any plan exceed a
    fraction of plain backprop), the smallest budget that fits, so a budget plan is still
    differentiated and checked."""
    return memgrad.strategies.Budget(int(error.smallest_feasible_bytes) + 1, margin=0.0, measure=False, simulate=False)


def check_graph(spec, only=None):
    """Builds `spec`'s graph, differentiates it every way, and returns a `GraphResult`.

    Args:
      spec: a `GraphSpec`.
      only: strategy names to check (default: all, plus `tape`).
    """
    graph = RandomGraph(spec)
    names = only or [n for n, _ in strategies_of(spec)] + ["tape"]
    strategies = [(n, c) for n, c in strategies_of(spec) if n in names]
    log = {}

    def xs_of(x, records):
        xs = graph.variables + [records[i] for i in spec.x_records]
        xs += [x] if spec.x_input else []
        return xs + ([graph.unused] if spec.x_unconnected else [])

    @tf.function(autograph=False)
    def step(x, ids, labels):
        with contextlib.ExitStack() as stack:
            # With `plain_tape`, a tf.GradientTape records the same forward as memgrad's
            # tape. Two tapes make it a higher-order computation, which wraps every
            # tf.cond in a function call: both forms of cond get drawn.
            plain = stack.enter_context(tf.GradientTape()) if spec.plain_tape else None
            tape = stack.enter_context(memgrad.GradientTape(checkpoints=spec.tape_checkpoints))
            for recording in filter(None, (plain, tape)):
                recording.watch(x)
            ys, records = graph.forward(x, ids, labels)
        xs = xs_of(x, records)
        stops = [records[i] for i in spec.stops]
        kwargs = {"stop_gradients": stops or None, "unconnected_gradients": spec.unconnected}

        def again(gradients_fn, grads, **more):
            """With `second_order`, the gradient of half the squared norm of ``grads``."""
            if not spec.second_order:
                return grads
            return gradients_fn(_half_squared_norm(grads), xs, **more)

        out = {"reference": again(tf.gradients, tf.gradients(ys, xs, **kwargs), **kwargs)}
        if spec.layers[-1][0] in HIGHER_KINDS:
            # The inner gradient step itself, against the same forward with tf.gradients.
            graph.inner_plain = True
            try:
                out["inner_plain"] = [graph.forward(x, ids, labels)[1][-1]]
            finally:
                graph.inner_plain = False
            out["inner"] = [records[-1]]
        # When the stops cut every path from the input, nothing upstream of them gets a
        # gradient; a strategy that kept only tensors there has nothing to recompute.
        log["cut"] = bool(stops) and tf.gradients(ys, [x], stop_gradients=stops)[0] is None
        for name, checkpoints in strategies:
            if checkpoints == "list":
                checkpoints = [records[i] for i in spec.list_checkpoints]
            def differentiate(c):
                grads = memgrad.gradients(ys, xs, checkpoints=c, **kwargs)
                return again(memgrad.gradients, grads, checkpoints=c, **kwargs)

            grads = _call(log, name, lambda c=checkpoints: differentiate(c),
                          retry=lambda error: differentiate(_smallest_budget(error)))
            if grads is not None:
                out[name] = grads
        if "tape" in names:
            # A tape has no stop_gradients: its reference is tf.GradientTape's gradient,
            # or else tf.gradients without stops, of the same forward.
            unconnected = {"unconnected_gradients": spec.unconnected}
            if plain is not None:
                reference = plain.gradient(ys, xs, **unconnected)
            else:
                reference = tf.gradients(ys, xs, **unconnected)
            out["tape_reference"] = again(tf.gradients, reference, **unconnected)
            grads = _call(log, "tape", lambda: again(
                memgrad.gradients, tape.gradient(ys, xs, **unconnected),
                checkpoints=spec.tape_checkpoints, **unconnected))
            if grads is not None:
                out["tape"] = grads
        return out

    try:
        results = step(graph.x, graph.ids, graph.labels)
    except Exception:  # noqa: BLE001
        if len(names) > 1:
            # One strategy's graph failed at run time: check each alone to name it.
            outcomes = [o for n in names for o in check_graph(spec, only=[n]).outcomes]
            return GraphResult(spec, outcomes)
        detail = traceback.format_exc(limit=-8)
        return GraphResult(spec, [Outcome(n, "crash", float("inf"), detail) for n in names])
    outcomes = [_outcome(n, log.get(n), results, log["cut"], spec.tolerance) for n in names]
    if "inner" in results:
        error, problem = compare(results["inner_plain"], results["inner"], spec.tolerance)
        status = "wrong" if problem or not error <= spec.tolerance else "ok"
        outcomes.append(Outcome("inner", status, error, problem or "the inner gradient step"))
    if any(o.status == "wrong" and o.detail.startswith("worst:") for o in outcomes):
        _triage(spec, outcomes, results)
    for o in outcomes:
        if log.get(o.strategy + ":budget_error"):
            o.budget_error = True
            o.detail = f"after a BudgetError, at the smallest feasible budget. {o.detail}"
    return GraphResult(spec, outcomes)


def _half_squared_norm(grads):
    """Half the sum of squares of a gradient list (None skipped), in float32: the scalar a
    `second_order` graph differentiates again."""
    parts = [tf.reduce_sum(tf.cast(tf.convert_to_tensor(g), tf.float32) ** 2)
             for g in grads if g is not None]
    return 0.5 * tf.add_n(parts) if parts else tf.zeros([])


def _float64_gradients(spec):
    """tf.gradients of `spec`'s graph in float64 (same values): with and without stops, and
    the inner gradient step's result where the graph takes one."""
    graph = RandomGraph(spec, "float64")
    graph.inner_plain = True

    @tf.function(autograph=False)
    def step(x, ids, labels):
        ys, records = graph.forward(x, ids, labels)
        xs = graph.variables + [records[i] for i in spec.x_records]
        xs += [x] if spec.x_input else []
        xs += [graph.unused] if spec.x_unconnected else []
        stops = [records[i] for i in spec.stops] or None

        def gradients(**kwargs):
            grads = tf.gradients(ys, xs, **kwargs)
            if spec.second_order:
                grads = tf.gradients(_half_squared_norm(grads), xs, **kwargs)
            return grads

        out = {"reference": gradients(stop_gradients=stops,
                                      unconnected_gradients=spec.unconnected),
               "tape_reference": gradients(unconnected_gradients=spec.unconnected)}
        if spec.layers[-1][0] in HIGHER_KINDS:
            out["inner_plain"] = [records[-1]]  # the inner gradient step's result
        return out

    return step(graph.x, graph.ids, graph.labels)


def _triage(spec, outcomes, results):
    """Re-judges gradients over the tolerance against float64 (exact-arithmetic) truth.

    Where a gradient is computed by cancellation (a parameter upstream of a batch
    normalisation, at batch 4), TensorFlow's own float32 gradient is off by more than 1e-5
    from the exact one, so memgrad's, summed in another order, can differ from it by more
    than 1e-5 too. Such an outcome becomes `noise` when memgrad is at most twice as far
    from the float64 gradient as tf.gradients is (or within the tolerance of it): memgrad
    is then as accurate as TensorFlow. Otherwise it stays `wrong`.
    """
    exact = _float64_gradients(spec)
    for o in outcomes:
        if o.status != "wrong" or not o.detail.startswith("worst:"):
            continue
        key = {"tape": "tape_reference", "inner": "inner_plain"}.get(o.strategy, "reference")
        tf_error, _ = compare(exact[key], results[key])
        memgrad_error, _ = compare(exact[key], results[o.strategy])
        o.detail += (f"; vs float64: tf.gradients {tf_error:.2e}, memgrad {memgrad_error:.2e}")
        if memgrad_error <= max(2.0 * tf_error, spec.tolerance):
            o.status = "noise"


def _outcome(name, logged, results, cut=False, tolerance=TOLERANCE):
    kind, value = logged if logged else ("entries", [])
    if kind != "entries":
        return Outcome(name, kind, 0.0 if kind == "budget_error" else float("inf"), value)
    reference = results["tape_reference" if name == "tape" else "reference"]
    error, problem = compare(reference, results[name], tolerance)
    if problem or not error <= tolerance:
        return Outcome(name, "wrong", error, problem)
    if not value:
        return Outcome(name, "fallback", error, "memgrad.gradients was not called")
    for entry in value:
        if entry.fallback and entry.mode == "budget":
            return Outcome(name, "budget_plain", error)
        if entry.fallback and entry.plan is not None and entry.plan.details.get("same_as_plain"):
            return Outcome(name, "speed_plain", error)
        if cut and not entry.fallback and entry.segments == 1:
            return Outcome(name, "cut_plain", error, "every checkpoint behind the stops")
        if entry.fallback or entry.segments < 2:
            return Outcome(name, "fallback", error, f"no real rewrite: {entry}")
    return Outcome(name, "ok", error)
