"""Replaying a forward pass: what a recomputation must see again, and what it cannot replay.

Shared by `memgrad.recompute` (memgrad/_src/recompute.py) and `ReversibleSequence`
(memgrad/_src/reversible/sequence.py, replay check in memgrad/_src/reversible/replay_check.py).

A recomputation reproduces its forward pass only if it sees the same variable values:
Keras seed generators (``keras.layers.Dropout`` and ``keras.random.*`` draw from a
`keras.random.SeedGenerator` whose state is a Keras variable advanced on every draw) and
normalisation statistics. Their forward-time values are kept (`snapshot`, `CaptureScope`)
and the recomputation runs under a `ReplayScope`, which shows it those values and discards
every assignment it makes (moving statistics are updated once, by the forward pass).
Randomness kept outside Keras variables (stateful TF random ops, ``tf.random.Generator``)
cannot be rewound: `find_stateful_random_op` finds it in a traced graph so callers can refuse it.
"""

from __future__ import annotations

import keras
import tensorflow as tf

# Random ops whose kernel keeps its own state: running the op again draws new numbers,
# whatever its op-level seed (in a graph, two copies of a seeded op happen to stay in step;
# eagerly they do not). Nothing outside the kernel can rewind it.
STATEFUL_RANDOM_OPS = frozenset({
    # tf.random.*, tf.nn.dropout, tf.image.random_*, tf.random.shuffle, tf.random.categorical
    "Multinomial", "ParameterizedTruncatedNormal", "RandomCrop", "RandomGamma", "RandomPoisson",
    "RandomPoissonV2", "RandomShuffle", "RandomStandardNormal", "RandomUniform", "RandomUniformInt",
    "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2", "TruncatedNormal",
    # candidate samplers (sampled softmax) and tf.random.experimental.non_deterministic_ints
    "AllCandidateSampler", "FixedUnigramCandidateSampler", "LearnedUnigramCandidateSampler",
    "LogUniformCandidateSampler", "ThreadUnsafeUnigramCandidateSampler", "UniformCandidateSampler",
    "NonDeterministicInts",
    # tf.random.Generator: its state is a tf.Variable, which Keras's replay cannot map
    "RngReadAndSkip", "RngSkip", "StatefulRandomBinomial", "StatefulStandardNormal",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulUniform", "StatefulUniformFullInt",
    "StatefulUniformInt",
})

ADVICE = (
    "Use seeded stateless randomness instead: tf.random.stateless_uniform, "
    "tf.random.stateless_normal or tf.nn.experimental.stateless_dropout with an explicit seed, "
    "or keras.random.* and keras.layers.Dropout with a keras.random.SeedGenerator kept as an "
    "attribute of one of the block's layers (its state is replayed);"
)


def find_stateful_random_op(graph, operations=None):
    """The first stateful random op in ``graph``, or ``None``.

    Args:
      graph: a `tf.Graph` (a traced function's graph).
      operations: only these `tf.Operation`s of ``graph`` (and the functions they call);
        default every op of ``graph`` and of its function library.

    Returns:
      An object with ``op`` (the op type) and ``name``, or ``None``.
    """
    if operations is None:
        graph_def = graph.as_graph_def()
        nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    else:
        nodes, called = [], set()
        for operation in operations:
            nodes.append(operation.node_def)
            called.update(value.func.name for value in operation.node_def.attr.values()
                          if value.HasField("func"))
        if called:  # nested functions (rare in a layer): scan the library once
            library = {f.signature.name: f for f in graph.as_graph_def().library.function}
            pending = list(called)
            while pending:
                function = library.get(pending.pop())
                if function is None:
                    continue
                for node in function.node_def:
                    nodes.append(node)
                    for value in node.attr.values():
                        if value.HasField("func") and value.func.name not in called:
                            called.add(value.func.name)
                            pending.append(value.func.name)
    for node in nodes:
        if node.op in STATEFUL_RANDOM_OPS:
            return node
    return None


class StateRecorder(keras.StatelessScope):
    """Notes which Keras variables a traced call reads and assigns.

    Inside a `StatelessScope`, Keras routes every variable read through
    `get_current_value` and every assignment through `add_update`. Returning ``None``
    keeps reads on the real variable, as in the real forward pass; assignments are
    dropped, which changes nothing in a trace that is never run.
    """

    def __init__(self):
        super().__init__()
        self.read, self.assigned = set(), {}

    def get_current_value(self, variable):
        self.read.add(id(variable))
        return None

    def add_update(self, update):
        variable, _ = update
        self.assigned[id(variable)] = variable


def snapshot(variables):
    """``[(variable, its current value)]``: the state a `ReplayScope` replays."""
    return [(v, tf.identity(v.value)) for v in variables]


class CaptureScope(keras.StatelessScope):
    """Runs a forward pass normally while keeping what its recomputation must replay.

    Every Keras variable the forward pass assigns (a seed generator drawing, a
    BatchNormalization updating its moving statistics) is assigned for real, as without
    the scope; its value from before the first assignment is kept in `state`. Inside an
    enclosing `StatelessScope` (Keras's stateless calls), reads and assignments go to it.

    Keras variables must not be created inside (Keras defers their initialisation in a
    stateless scope): build layers before.
    """

    def __init__(self):
        super().__init__()
        self._state = {}

    @property
    def state(self):
        """``[(variable, value before the forward pass assigned it)]``."""
        return list(self._state.values())

    def get_current_value(self, variable):
        if self.original_scope is not None:
            return self.original_scope.get_current_value(variable)
        return None

    def add_update(self, update):
        variable, value = update
        if id(variable) not in self._state:
            current = self.get_current_value(variable)
            before = variable.value if current is None else current  # read by Keras, no recursion
            self._state[id(variable)] = (variable, tf.identity(before))
        if self.original_scope is not None:
            self.original_scope.add_update(update)
            return
        # Assign for real: step out of this scope for the assignment only.
        keras_scope_exit(self)
        try:
            variable.assign(value)
        finally:
            self.__enter__()


def keras_scope_exit(scope):
    """Leaves ``scope`` (a `keras.StatelessScope`) without initialising deferred variables."""
    initialize, scope.initialize_variables = scope.initialize_variables, False
    try:
        scope.__exit__(None, None, None)
    finally:
        scope.initialize_variables = initialize


class ReplayScope(keras.StatelessScope):
    """Shows a recomputation the forward-time values in ``state``; discards its assignments.

    Variables not in ``state`` read their current value (or an enclosing stateless
    scope's). Every assignment made inside is kept in the scope only, so a
    BatchNormalization recomputed in training mode does not update its statistics again.

    Args:
      state: ``[(variable, value)]`` from `snapshot` or `CaptureScope.state`.
    """

    def __init__(self, state=()):
        super().__init__(state_mapping=list(state))

    def get_current_value(self, variable):
        value = self.state_mapping.get(id(variable))
        if value is None and self.original_scope is not None:
            return self.original_scope.get_current_value(variable)
        return value
