"""A graph being traced, run once on zeros to measure the peak memory of part of it.

`measured_peak(graph, fetches, device)` takes the ops ``fetches`` need from a graph (a
`tf.function`'s FuncGraph while it is traced), imports them into a function of their own
and runs it on the device: the graph's arguments are fed zeros of their static shapes, its
captured variables are the real ones (read, never written). The figure is the allocator's
peak during the run above what existed before it, less the fetched outputs: the terms
`memgrad.profiler.measure(step).peak_above_baseline_bytes` reports, for the same ops, the
same kernels (oneDNN's rewrites and XLA included) and the same executor.

Used by the `Budget` strategy to put plain backprop and each candidate plan on the scale a
user measures. It refuses (returns None) where running the ops would change state or
cannot run: an op that writes a variable or advances a random generator, an argument whose
shape is not static, a capture from an enclosing graph, an allocator without statistics.
"""

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.graph.kernels import called_functions, statistics_available, unregistered_functions

# Stateful ops that only read, or whose state is private to the imported copy (the legacy
# random ops keep their generator in the kernel instance), or that call functions whose own
# ops are checked.
_HARMLESS_STATEFUL = frozenset({
    "ReadVariableOp", "VarHandleOp", "VarIsInitializedOp", "VariableShape", "ResourceGather",
    "ResourceGatherNd", "Placeholder", "NoOp",
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "Multinomial",
    "StatefulPartitionedCall", "PartitionedCall", "While", "If", "Case",
    "TensorListReserve", "TensorListFromTensor", "TensorListSetItem", "TensorListGetItem",
    "TensorListStack", "TensorListPushBack", "TensorListPopBack", "EmptyTensorList",
    "Print", "PrintV2", "Assert",
})


def _reachable_functions(graph_def):
    """The FunctionDefs of ``graph_def.library`` its nodes call, directly or not."""
    library = {f.signature.name: f for f in graph_def.library.function}
    found, stack = {}, [name for node in graph_def.node for name in called_functions(node.attr)]
    while stack:
        name = stack.pop()
        if name in found or name not in library:
            continue
        found[name] = library[name]
        stack.extend(n for node in library[name].node_def for n in called_functions(node.attr))
    return found


def _ancestors(graph_def, names):
    """A GraphDef of the nodes ``names`` need (data and control inputs), with the library."""
    nodes = {node.name: node for node in graph_def.node}
    needed, stack = set(), list(names)
    while stack:
        name = stack.pop()
        if name in needed or name not in nodes:
            continue
        needed.add(name)
        stack.extend(entry.lstrip("^").split(":")[0] for entry in nodes[name].input)
    sub = tf.compat.v1.GraphDef()
    sub.versions.CopyFrom(graph_def.versions)
    sub.library.CopyFrom(graph_def.library)
    sub.node.extend(node for node in graph_def.node if node.name in needed)
    for node in sub.node:
        if "_class" in node.attr:  # colocation with nodes that may be left out
            del node.attr["_class"]
    return sub


def writes_state(graph_def):
    """The first op type among ``graph_def``'s nodes (and the functions they call) whose
    run would change state outside the run, or None."""
    nodes = list(graph_def.node)
    for function in _reachable_functions(graph_def).values():
        nodes.extend(function.node_def)
    for node in nodes:
        if node.op in _HARMLESS_STATEFUL:
            continue
        op_def = tf_internals.op_def_of(node.op)
        if op_def is None or op_def.is_stateful:
            return node.op
    return None


def _import_plan(graph, graph_def):
    """``(fed, captured)``: the placeholders fed zeros ``[(name, dtype, shape)]`` and those
    fed the captured eager tensors ``[(name, tensor)]``; None when one cannot be fed."""
    captures = {internal.op.name: external for external, internal in graph.captures}
    fed, captured = [], []
    for node in graph_def.node:
        if node.op != "Placeholder":
            continue
        external = captures.get(node.name)
        if external is not None:
            # An eager tensor (a variable's handle, a constant) is fed as it is; a tensor
            # of an enclosing graph (a nested tf.function's capture) is not available here.
            if not isinstance(external, tf.Tensor) or hasattr(external, "graph"):
                return None
            captured.append((node.name, external))
            continue
        tensor = graph.get_tensor_by_name(f"{node.name}:0")
        if not tensor.shape.is_fully_defined() or tensor.dtype in (tf.resource, tf.variant):
            return None
        fed.append((node.name, tensor.dtype, tensor.shape))
    return fed, captured


def measured_peak(graph, fetches, device, runs=5, count_outputs=False):
    """The median of `measured_peaks`' runs, or None where it returns None."""
    peaks = measured_peaks(graph, fetches, device, runs=runs, count_outputs=count_outputs)
    return None if peaks is None else peaks[len(peaks) // 2]


def measured_peaks(graph, fetches, device, runs=5, count_outputs=False):
    """The peak bytes above the baseline of running ``fetches`` of ``graph`` on zeros, in
    each of ``runs`` runs after a first one that builds the kernels: the executor's order of
    ops, and so the peak, varies from run to run by up to 10-15% on a CPU with two threads,
    and some graphs' peaks take two values by it (GPT-2's under a half-way Budget: 22 or
    25.5 MiB), which a median of five runs can miss.

    Args:
      graph: a `tf.Graph` or FuncGraph (typically one being traced).
      fetches: tensors of ``graph`` to compute (small ones: they are subtracted).
      device: where to run, e.g. ``'CPU:0'`` (its allocator must keep statistics).
      runs: measured runs.
      count_outputs: count the fetched tensors in the peak (they are alive at the end of
        the run, as a step's gradients are until an optimizer applies them all); by default
        they are subtracted.

    Returns:
      The runs' bytes, smallest first, or None when the ops cannot be run on their own without changing state
      (see the module's docstring) or the run fails.
    """
    if device is None or not statistics_available(device):
        return None
    graph_def = graph.as_graph_def()
    names = list(dict.fromkeys(f.op.name for f in fetches))
    sub = _ancestors(graph_def, names)
    if writes_state(sub) is not None:
        return None
    plan = _import_plan(graph, sub)
    if plan is None:
        return None
    fed, captured = plan
    kept = unregistered_functions(sub.library)
    del sub.library.function[:]
    sub.library.function.extend(kept)
    placeholders = [name for name, _ in captured] + [name for name, _, _ in fed]
    outputs = [f.name for f in fetches]

    def body(*tensors):
        return tf.graph_util.import_graph_def(
            sub, input_map={f"{name}:0": t for name, t in zip(placeholders, tensors)},
            return_elements=outputs, name="memgrad_measured")

    try:
        with tf.init_scope():
            specs = ([tf.TensorSpec(t.shape, t.dtype) for _, t in captured]
                     + [tf.TensorSpec(shape, dtype) for _, dtype, shape in fed])
            run = tf.compat.v1.wrap_function(body, specs)
            with tf.device(device):
                arguments = ([t for _, t in captured]
                             + [tf.zeros(shape, dtype) for _, dtype, shape in fed])
                run(*arguments)  # the first run builds kernels (and compiles XLA)
                peaks = []
                for _ in range(runs):
                    tf.config.experimental.reset_memory_stats(device)
                    before = tf.config.experimental.get_memory_info(device)["current"]
                    results = run(*arguments)
                    peak = tf.config.experimental.get_memory_info(device)["peak"]
                    produced = 0 if count_outputs else sum(
                        r.shape.num_elements() * r.dtype.size for r in tf.nest.flatten(results)
                        if r.dtype not in (tf.resource, tf.variant))
                    del results
                    peaks.append(max(int(peak - before - produced), 0))
                del arguments
    except (tf.errors.OpError, ValueError, TypeError, KeyError):
        return None
    return sorted(peaks)
