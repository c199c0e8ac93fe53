"""Kernels' scratch buffers, measured: the memory an op allocates while it runs beyond its
outputs, which no graph shows.

On a CPU without oneDNN, Eigen's convolution gradients allocate a working set of up to about
32 MiB each (`Conv2DBackpropInput` on a 16x16x16x24 input: 33 MiB); with oneDNN, its
primitives hold their own buffers; an XLA-compiled call allocates one temporary buffer for
everything it computes (ConvNeXt's grouped convolutions on CPU: 220 MiB). `kernel_scratch`
runs each distinct such op of a graph once, alone, on zeros of its input shapes, and reads the
allocator's peak above its inputs and outputs. Distinct means op, attributes, input shapes
and constant inputs; results are cached for the process, per device.

The ops are run eagerly through a one-node function, so TensorFlow applies the same kernel
selection (oneDNN's rewrites included) as when it runs the step. Needs an allocator that keeps
statistics (`tf.config.experimental.get_memory_info`): a GPU's, or the CPU's BFC allocator,
which importing memgrad selects.
"""

import numpy as np
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.allocator import MemoryWindow, statistics_available

_CACHE = {}  # (device, kernel key) -> scratch bytes
_VARIABLES = 0  # resources made for kernels reading a variable


def data_inputs(node):
    """The ``(producer name, output index)`` of each data input of a NodeDef, in order
    (control inputs, ``^name``, left out)."""
    for entry in node.input:
        if not entry.startswith("^"):
            source, _, index = entry.partition(":")
            yield source, int(index or 0)


def called_functions(attrs):
    """Names of the functions an op's attributes name (``func`` and list-of-func values): the
    functions a call, loop or conditional runs. ``attrs``: a NodeDef's or Operation's
    ``attr`` map."""
    for value in attrs.values():
        if value.HasField("func"):
            yield value.func.name
        elif value.HasField("list"):
            for function in value.list.func:
                yield function.name


def unregistered_functions(library):
    """The FunctionDefs of ``library`` the process does not hold yet: a graph imported with
    them uses the ones it holds as registered (a second definition under the same name is
    refused; Grappler's optimized copies may differ)."""
    return [f for f in library.function if not tf_internals.registered_function(f.signature.name)]


def compiled_functions(library):
    """Names of the functions of a `FunctionDefLibrary` marked for XLA compilation."""
    return {f.signature.name for f in library.function
            if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b}


def _compiled(node, compiled):
    """Whether ``node`` is an XLA-compiled call: marked itself, or calling a function that is
    (attributes are read without adding them)."""
    if "_XlaMustCompile" in node.attr and node.attr["_XlaMustCompile"].b:
        return True
    return "f" in node.attr and node.attr["f"].func.name in compiled


def _has_scratch(node, compiled):
    """Ops measured: convolutions (Eigen's and oneDNN's working sets) and XLA-compiled calls."""
    return "Conv" in node.op or _compiled(node, compiled)


def _inputs(node, nodes, outputs):
    """Per data input: ``("const", NodeDef)`` for a constant (shape arguments must keep their
    values), else ``(dtype, shape)`` from the simulation, or None when unknown."""
    found = []
    for source, index in data_inputs(node):
        producer = nodes.get(source)
        if producer is not None and producer.op in ("Const", "HostConst"):
            found.append(("const", producer))
        elif producer is not None and producer.op == "VarHandleOp":
            found.append(("variable", producer))
        else:
            found.append(outputs.get((source, index)))
    return found


def _key(node, inputs):
    def described(item):
        kind, value = item
        if kind == "const":
            return ("const", value.attr["value"].SerializeToString(deterministic=True))
        if kind == "variable":
            return ("variable", value.attr["dtype"].type,
                    tuple(tf.TensorShape(value.attr["shape"].shape).as_list()))
        return (kind.name, tuple(value.as_list()))

    attrs = tuple(sorted((name, value.SerializeToString(deterministic=True))
                         for name, value in node.attr.items() if not name.startswith("_output_shapes")))
    return node.op, tuple(described(item) for item in inputs), attrs


def _one_node_function(node, inputs, library):
    """A concrete function running ``node`` alone on placeholders of its input shapes."""
    graph_def = tf.compat.v1.GraphDef()
    if library is not None:
        # Functions the process knows already (the step's own, under the same names) are
        # used as registered; Grappler's optimized copies may differ and cannot replace them.
        graph_def.library.function.extend(unregistered_functions(library))
        graph_def.library.gradient.extend(library.gradient)
    fed = []
    for position, (kind, value) in enumerate(inputs):
        source = graph_def.node.add()
        if kind == "const":
            source.CopyFrom(value)
            del source.input[:]
        else:
            fed.append(position)
            source.op = "Placeholder"
            if kind == "variable":
                source.attr["dtype"].type = tf.resource.as_datatype_enum
                source.attr["shape"].shape.CopyFrom(tf.TensorShape([]).as_proto())
            else:
                source.attr["dtype"].type = kind.as_datatype_enum
                source.attr["shape"].shape.CopyFrom(value.as_proto())
        source.name = f"memgrad_input_{position}"
        source.device = ""
    kernel = graph_def.node.add()
    kernel.CopyFrom(node)
    kernel.name = "memgrad_kernel"
    kernel.device = ""
    del kernel.input[:]
    kernel.input.extend(f"memgrad_input_{position}" for position in range(len(inputs)))
    # Shapes of the original graph, and colocation with nodes this graph does not hold (a
    # gradient's with its forward op) would not import.
    for name in [name for name in kernel.attr if name.startswith("_output_shapes") or name == "_class"]:
        del kernel.attr[name]

    def body(*tensors):
        (operation,) = tf.graph_util.import_graph_def(
            graph_def, input_map={f"memgrad_input_{p}:0": t for p, t in zip(fed, tensors)},
            return_elements=["memgrad_kernel"], name="")
        return list(operation.outputs)

    specs = [tf.TensorSpec([], tf.resource) if inputs[p][0] == "variable"
             else tf.TensorSpec(inputs[p][1], inputs[p][0]) for p in fed]
    function = tf.compat.v1.wrap_function(body, specs)
    return function, fed


def _measure(node, inputs, library, device):
    run, fed = _one_node_function(node, inputs, library)
    with tf.device(device):
        handles, arguments = [], []
        for p in fed:
            kind, value = inputs[p]
            if kind == "variable":
                # A bare resource, not a tf.Variable: no variable creator (a distribution
                # strategy's) sees it.
                handles.append(_zeros_variable(tf.as_dtype(value.attr["dtype"].type),
                                               tf.TensorShape(value.attr["shape"].shape)))
                arguments.append(handles[-1])
            else:
                arguments.append(tf.zeros(value, kind))
        run(*arguments)  # the first call builds the kernel (and compiles XLA)
        readings = []
        for _ in range(2):  # the least of two: the allocator's history can round one up
            with MemoryWindow(device) as window:
                results = run(*arguments)
            produced = sum(int(np.prod(r.shape)) * r.dtype.size for r in tf.nest.flatten(results)
                           if r.dtype not in (tf.resource, tf.variant))
            del results
            readings.append(window.peak_above_baseline_bytes - produced)
        for handle in handles:
            tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)
    return max(int(min(readings)), 0)


def _zeros_variable(dtype, shape):
    global _VARIABLES
    _VARIABLES += 1
    handle = tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape, container="",
                                    shared_name=f"memgrad_kernel_scratch_{_VARIABLES}")
    tf.raw_ops.AssignVariableOp(resource=handle, value=tf.zeros(shape, dtype))
    return handle


def measuring_device():
    """Where kernels' scratch is measured by default: the first GPU if any, else the CPU;
    None when that device's allocator keeps no statistics."""
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    return device if statistics_available(device) else None


def kernel_scratch(graph_def, outputs, device="CPU:0"):
    """Scratch bytes per node of ``graph_def`` for its convolutions and XLA-compiled calls.

    Args:
      graph_def: the (optimized) `GraphDef` whose ops are measured.
      outputs: ``{(node name, port): (dtype, TensorShape)}`` of the graph's tensors.
      device: where to run the kernels, e.g. ``'CPU:0'`` or ``'GPU:0'``.

    Returns:
      ``{node name: bytes}`` for the nodes measured (nodes with unknown input shapes, and
      ops that fail alone, are left out).
    """
    nodes = {node.name: node for node in graph_def.node}
    compiled = compiled_functions(graph_def.library)
    found = {}
    with tf.init_scope():
        for node in graph_def.node:
            if not _has_scratch(node, compiled):
                continue
            inputs = _inputs(node, nodes, outputs)
            if any(item is None or (item[0] not in ("const", "variable")
                                    and not item[1].is_fully_defined())
                   for item in inputs):
                continue
            key = (device, _key(node, inputs))
            if key not in _CACHE:
                library = graph_def.library if _compiled(node, compiled) else None
                try:
                    _CACHE[key] = _measure(node, inputs, library, device)
                except (tf.errors.OpError, ValueError, TypeError):
                    _CACHE[key] = None  # an op that cannot run alone: its scratch is left out
            if _CACHE[key]:
                found[node.name] = _CACHE[key]
    return found


def shapes_folded(graph):
    """``graph``'s GraphDef with each output of a `Shape` or `ShapeN` of a statically shaped
    tensor replaced by a constant, as Grappler folds them before a function runs (a
    convolution gradient's ``input_sizes`` must hold the real sizes when its kernel runs
    alone)."""
    graph_def = graph.as_graph_def()
    folded = {}  # "name:port" -> the constant's name
    for node in list(graph_def.node):
        if node.op not in ("Shape", "ShapeN"):
            continue
        op = graph.get_operation_by_name(node.name)
        dtype = tf.as_dtype(node.attr["out_type"].type)
        for port, source in enumerate(op.inputs):
            if not source.shape.is_fully_defined():
                continue
            const = graph_def.node.add()
            const.name = f"{node.name}_folded_{port}"
            const.op = "Const"
            const.attr["dtype"].type = dtype.as_datatype_enum
            const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(source.shape.as_list(), dtype))
            folded[f"{node.name}:{port}"] = const.name
            if port == 0:
                folded[node.name] = const.name
    for node in graph_def.node:
        for i, entry in enumerate(node.input):
            if entry in folded:
                node.input[i] = folded[entry]
    return graph_def


CALL_TYPES = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def is_compiled_call(op):
    """Whether ``op`` is a call marked for XLA compilation (``jit_compile=True``: Keras's
    grouped convolutions on CPU are such calls)."""
    return op.type in CALL_TYPES and _compiled(op.node_def, ())


@tf.autograph.experimental.do_not_convert
def compiled_gradient_scratch(graph, ops, device):
    """The temporary buffer of each XLA-compiled call's gradient among ``ops``: ``{op: bytes}``.

    Each call's gradient is traced on the side in ``graph`` (never run: TensorFlow prunes
    what no output needs) and its compiled backward call measured alone (`kernel_scratch`).
    ConvNeXtTiny's last grouped convolution, 7x7 over 768 channels: 220.5 MiB, two dense
    filters. Calls whose gradient cannot be traced or measured are left out.
    """
    found = {}
    made = {}
    for op in ops:
        ys = [t for t in op.outputs if t.dtype.is_floating]
        xs = [t for t in op.inputs if t.dtype.is_floating]
        if not ys or not xs:
            continue
        try:
            with graph.as_default(), tf.name_scope("memgrad_model_compiled"):
                first = len(graph.get_operations())
                tf.gradients(ys, xs, grad_ys=[tf.ones_like(t) for t in ys])
            made[op] = [g for g in graph.get_operations()[first:] if is_compiled_call(g)]
        except Exception:  # noqa: BLE001 - no side gradient: left out
            continue
    calls = {g for grads in made.values() for g in grads}
    if not calls:
        return found
    graph_def = graph.as_graph_def()
    needed = {g.name for g in calls} | {t.op.name for g in calls for t in g.inputs}
    subset = tf.compat.v1.GraphDef()
    subset.library.CopyFrom(graph_def.library)
    subset.node.extend(node for node in graph_def.node if node.name in needed)
    shapes = {(t.op.name, t.value_index): (t.dtype, t.shape) for g in calls for t in g.inputs}
    scratch = kernel_scratch(subset, shapes, device)
    for op, grads in made.items():
        found[op] = max((scratch.get(g.name, 0) for g in grads), default=0)
    return found
