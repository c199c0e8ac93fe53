"""Refuses blocks whose forward pass the backward recomputation cannot reproduce.

The backward pass of a `ReversibleSequence` runs each block's networks again and replays
the block's `replayed_state` (Keras seed generators, normalisation statistics). Randomness
kept anywhere else draws new numbers the second time, and the gradients silently stop
matching the forward pass (measured 46% to 400% off plain autodiff).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.reversible.base import layer_name

# Random ops whose kernel keeps its own state: running the op again draws new numbers,
# whatever its op-level seed (in a graph, two copies of a seeded op happen to stay in step;
# eagerly they do not). Nothing outside the kernel can rewind it.
_STATEFUL_RANDOM_OPS = frozenset({
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

_ADVICE = (
    "Use seeded stateless randomness instead: tf.random.stateless_uniform, "
    "tf.random.stateless_normal or tf.nn.experimental.stateless_dropout with an explicit seed, "
    "or keras.random.* and keras.layers.Dropout with a keras.random.SeedGenerator kept as an "
    "attribute of one of the block's layers (its state is replayed); or move the randomness "
    "out of the stack, or use plain_backprop=True."
)


class _StateRecorder(keras.StatelessScope):
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


def check_replayable(stack, index, input_spec, training):
    """Raises if recomputing block ``index`` of ``stack`` would not reproduce its forward pass.

    Traces the block's `forward` on ``input_spec`` into a scratch graph (never run)
    and looks for stateful random ops, including inside nested functions, and for Keras
    variables the block reads and advances without owning them (Keras's global
    SeedGenerator, behind unseeded ``keras.random`` ops). Variables the block owns are its
    own business: `replayed_state` decides which ones the recomputation sees again.

    Args:
      stack: the `ReversibleSequence` running the block.
      index: the block's position in ``stack.blocks``; it has already run on such inputs.
      input_spec: a `tf.TensorSpec` of the block's input.
      training: the Keras training flag of the call.

    Raises:
      ValueError: naming the op or variable that cannot be replayed.
    """
    block = stack.blocks[index]
    recorder = _StateRecorder()

    def forward(t):
        with recorder:
            return block.forward(t, training=training)

    with tf_internals.stop_recording():  # the scratch trace is no part of any outer tape's computation
        graph = tf.function(forward).get_concrete_function(input_spec).graph
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    where = f"{layer_name(block)} (block {index} of {layer_name(stack)})"
    for node in nodes:
        if node.op in _STATEFUL_RANDOM_OPS:
            raise ValueError(
                f"{where} draws random numbers with a stateful random op. The backward pass "
                "runs the block again and expects the same result, but such an op draws new "
                f"numbers, so the gradients would be wrong. {_ADVICE} Received: {node.op} op "
                f"'{node.name}'"
            )

    owned = {id(v) for v in block.variables} | {id(v) for v in block.replayed_state()}
    for key, variable in recorder.assigned.items():
        if key in recorder.read and key not in owned:
            raise ValueError(
                f"{where} reads and advances a Keras variable that is not among its variables, "
                "so the backward pass, which runs the block again, would see the advanced value "
                "and the gradients would be wrong. An unseeded keras.random.* op does this with "
                "Keras's global SeedGenerator (named after the layer that first drew from it). "
                f"{_ADVICE} Received: reads and assigns '{variable.path}'"
            )
