"""Refuses blocks whose forward pass the backward recomputation cannot reproduce.

The backward pass of a `ReversibleSequence` runs each block's networks again and replays
the block's `replayed_state` (Keras seed generators, normalisation statistics). Randomness
kept anywhere else draws new numbers the second time, and the gradients silently stop
matching the forward pass (measured 46% to 400% off plain autodiff). The op list and the
graph scan are shared with `memgrad.recompute` (memgrad/_src/replay.py).
"""

from __future__ import annotations

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.replay import ADVICE, STATEFUL_RANDOM_OPS, StateRecorder, find_stateful_random_op
from memgrad._src.reversible.base import layer_name

_STATEFUL_RANDOM_OPS = STATEFUL_RANDOM_OPS  # the name this module used to define
_ADVICE = (f"{ADVICE} or move the randomness out of the stack, or use plain_backprop=True.")


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
    recorder = StateRecorder()

    def forward(t):
        with recorder:
            return block.forward(t, training=training)

    with tf_internals.stop_recording():  # the scratch trace is no part of any outer tape's computation
        graph = tf.function(forward).get_concrete_function(input_spec).graph
    where = f"{layer_name(block)} (block {index} of {layer_name(stack)})"
    node = find_stateful_random_op(graph)
    if node is not None:
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
