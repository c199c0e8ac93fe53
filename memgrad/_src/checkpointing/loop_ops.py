"""Building blocks of loop gradients: While ops copied with fresh function graphs, their
attributes, TensorLists, and control waits."""

import contextlib

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from memgrad._src import tf_internals
from memgrad._src.recompute import Gate


# ---------------------------------------------------------------------- building blocks
def attr_types(dtypes):
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
        type=[d.as_datatype_enum for d in dtypes]))


def attr_shapes(shapes):
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
        shape=[tf.TensorShape(s).as_proto() for s in shapes]))


def attr_function(name):
    return attr_value_pb2.AttrValue(func=attr_value_pb2.NameAttrList(name=name))


def loop_copy(op, inputs, attrs, name):
    """A new `While` op like ``op`` on ``inputs``, ready for `tf_internals.while_gradient`.

    Its body and condition are fresh FuncGraphs with names of their own: the gradient
    renames and redefines them (to add accumulators), which must not clash between copies.
    """
    graph = tf.compat.v1.get_default_graph()
    types = [t.dtype for t in inputs]
    with graph.device(op.device) if op.device else contextlib.nullcontext():
        copy = graph.create_op(op.type, inputs, types, name=name, attrs=attrs)
    _give_fresh_graphs(copy)
    return copy


_FUNCTION_GRAPHS = {
    "While": (("body", "_body_graph"), ("cond", "_cond_graph")),
    "StatelessWhile": (("body", "_body_graph"), ("cond", "_cond_graph")),
    "If": (("then_branch", "_true_graph"), ("else_branch", "_false_graph")),
    "StatelessIf": (("then_branch", "_true_graph"), ("else_branch", "_false_graph")),
}


def _give_fresh_graphs(op):
    """Attaches fresh FuncGraphs with unique names to ``op`` and to every loop or conditional
    nested in them.

    TensorFlow's gradient of a loop or conditional rewrites its functions under the name
    ``<function>_rewritten``; functions it rebuilds from the library keep the library's name.
    Two copies of a loop differentiated in one graph (two memgrad calls, or a nested loop
    replayed in two segments) would then define one name twice, differently. The resource
    inputs of the rebuilt functions get the handle data of the op's (TensorFlow's rebuild of
    a loop's functions leaves it out, and a nested loop then gives a variable it reads a
    zero gradient).
    """
    if op.type in _FUNCTION_GRAPHS:
        if op.type.endswith("While"):
            shapes = [tf.TensorShape(s) for s in op.get_attr("output_shapes")]
        else:
            shapes = [t.shape for t in op.inputs[1:]]
        pairs = [(op.get_attr(key).name, cached) for key, cached in _FUNCTION_GRAPHS[op.type]]
    elif op.type in ("Case", "StatelessCase"):
        shapes = [t.shape for t in op.inputs[1:]]
        pairs = [(f.name, f"_branch_graph_{i}") for i, f in enumerate(op.get_attr("branches"))]
    else:
        return
    inputs = op.inputs if op.type.endswith("While") else op.inputs[1:]
    for name, cached in pairs:
        function = tf_internals.function_graph_of(op, shapes, name)
        function.name = f"{name}_memgrad_{tf_internals.unique_id()}"
        for outer, inner in zip(inputs, function.inputs):
            tf_internals.copy_handle_data(outer, inner)
        setattr(op, cached, function)
        for inner in function.get_operations():
            _give_fresh_graphs(inner)


def waiting_for(tensors, prerequisites):
    """``tensors`` that only exist once every prerequisite does (a control dependency, through
    `Gate.waits`: one edge per tensor, not one per tensor per prerequisite)."""
    waits = Gate(prerequisites).waits()
    if not waits:
        return list(tensors)
    with tf.control_dependencies(waits):
        return [tf.identity(t) if t.dtype != tf.resource else t for t in tensors]


def densified(grad):
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def relaxed_shape(tensor):
    return tf.TensorShape([]) if tensor.dtype == tf.variant else tf.TensorShape(None)


def shape_tensor(shape):
    """A TensorList element shape: the static shape, -1 for unknown dimensions."""
    shape = tf.TensorShape(shape)
    if shape.rank is None:
        return tf.constant(-1, tf.int32)
    return tf.constant([-1 if d is None else d for d in shape.as_list()], tf.int32)


def empty_like_list(handle, inner):
    """An item-less TensorList as long as the list ``handle`` (the body reads it as
    ``inner``), or None if the body never reads an item of it."""
    dtypes = {c.get_attr("element_dtype") for c in inner.consumers()
              if "element_dtype" in c.node_def.attr}
    if len(dtypes) != 1:
        return None
    return tf.raw_ops.TensorListReserve(
        element_shape=tf.raw_ops.TensorListElementShape(input_handle=handle,
                                                        shape_type=tf.int32),
        num_elements=tf.raw_ops.TensorListLength(input_handle=handle),
        element_dtype=dtypes.pop())
