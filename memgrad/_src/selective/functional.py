"""`LeanFunctional`: a functional model whose eager forward releases each output after its last use."""

from __future__ import annotations

import collections
import weakref

import keras
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.selective.runner import call_operation

# model -> (nodes in run order, {id(symbolic tensor): number of uses}). A functional graph
# does not change after construction; kept outside the model because Keras tracks what is
# set on a layer (a list of nodes there would register their layers as sublayers).
_plans = weakref.WeakKeyDictionary()


def _plan(model):
    plan = _plans.get(model)
    if plan is None:
        nodes = tf_internals.functional_nodes_in_order(model)
        uses = collections.Counter()
        for node in nodes:
            uses.update(id(x) for x in node.input_tensors)
        uses.update(id(x) for x in model.outputs)
        plan = _plans[model] = (nodes, dict(uses))
    return plan


def run_lean(model, inputs, operation_fn):
    """Runs ``model``'s functional graph on eager ``inputs`` as Keras does, releasing tensors early.

    The nodes run in Keras's order with the same arguments; a computed tensor is dropped
    as soon as its last consumer has run (Keras keeps every one until the call returns),
    and a layer no gradient can flow through runs unrecorded (`call_operation`).
    """
    nodes, uses = _plan(model)
    remaining = dict(uses)
    computed = {id(x): y for x, y in zip(model.inputs, tf.nest.flatten(inputs))}
    for node in nodes:
        if any(id(x) not in computed for x in node.input_tensors):
            continue  # not computable from these inputs (Keras skips it too)
        args, kwargs = tf_internals.functional_node_arguments(node, computed)
        operation = tf_internals.functional_node_operation(model, node)
        outputs = call_operation(operation, operation_fn(operation), args, kwargs)
        del args, kwargs
        for x in node.input_tensors:
            remaining[id(x)] -= 1
            if remaining[id(x)] == 0:
                computed.pop(id(x), None)
        for x, y in zip(tf_internals.functional_node_outputs(node), tf.nest.flatten(outputs)):
            if remaining.get(id(x), 0) > 0:
                computed[id(x)] = y
        del outputs
    missing = [x.name for x in model.outputs if id(x) not in computed]
    if missing:
        raise ValueError(f"Outputs {missing} of {model.name} are not connected to its inputs. "
                         f"Received: inputs of shapes {[tuple(t.shape) for t in tf.nest.flatten(inputs)]}")
    return tf.nest.pack_sequence_as(tf_internals.functional_outputs_structure(model),
                                    [computed[id(x)] for x in model.outputs])


@keras.saving.register_keras_serializable(package="memgrad")
class LeanFunctional(tf_internals.keras_functional):
    """A functional ``keras.Model`` whose eager forward pass frees each output after its last use.

    Keras's functional runner keeps every layer's output until the model's call
    returns, so an eager training step peaks at all activations whatever the tape
    keeps. ``LeanFunctional`` runs the same layers in the same order with the same
    arguments (outputs are bit for bit Keras's) and drops each intermediate tensor
    once its last consumer has run. A layer with no trainable weights whose inputs
    no tape watches (a frozen backbone's layers) runs unrecorded, so the tape keeps
    nothing for it. Inside ``tf.function`` (``fit``, ``predict``) and for symbolic
    inputs Keras's own runner is used: there TensorFlow frees tensors itself.
    `convert` returns one for every functional model; it is built like
    ``keras.Model(inputs, outputs)`` and saves to and loads from ``.keras`` files.

    Args:
      inputs: the model's ``keras.Input`` tensors (any structure).
      outputs: its output tensors (any structure).
      name: the model name.
      **kwargs: what ``keras.Model(inputs, outputs, ...)`` accepts.

    Returns:
      A model that computes ``outputs`` from ``inputs``.

    Example:
      >>> inputs = keras.Input((8,))
      >>> hidden = keras.layers.Dense(16, activation="relu")(inputs)
      >>> model = LeanFunctional(inputs, keras.layers.Dense(2)(hidden))
      >>> model(tf.ones((3, 8))).shape
      TensorShape([3, 2])
    """

    def _run_through_graph(self, inputs, operation_fn=lambda op: op, call_fn=None):
        flat = tf.nest.flatten(inputs)
        if call_fn is not None or not tf.executing_eagerly() or any(
                isinstance(x, keras.KerasTensor) for x in flat):
            return super()._run_through_graph(inputs, operation_fn=operation_fn, call_fn=call_fn)
        return run_lean(self, inputs, operation_fn)
