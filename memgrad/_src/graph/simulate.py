"""A graph's peak memory, simulated by Grappler without running it (nothing here modifies the
graph: it is exported to a GraphDef first).

`simulate_peak(graph, fetches)` hands the GraphDef to Grappler, TensorFlow's graph optimizer,
with the rewrites TensorFlow applies before running a function, and asks Grappler's virtual
cluster to simulate the optimized graph's execution: every op's outputs are allocated from
their static shapes and freed after their last consumer. Used by
`memgrad.profiler.predict_peak` and by the `Budget` strategy.
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.graph.kernels import data_inputs, kernel_scratch

# The one device of the virtual cluster. Its speed figures matter only for the simulated
# time, which is not used; memory is accounted per tensor from static shapes.
_DEVICE_NAME = "/job:localhost/replica:0/task:0/device:CPU:0"


@dataclasses.dataclass(frozen=True)
class SimulatedPeak:
    """Attributes: ``peak_bytes`` (everything held at the peak, variables and inputs
    included), ``variable_bytes``, ``input_bytes``."""

    peak_bytes: int
    variable_bytes: int
    input_bytes: int

    @property
    def peak_above_baseline_bytes(self) -> int:
        return max(self.peak_bytes - self.variable_bytes - self.input_bytes, 0)


def _nbytes(dtype, shape):
    if dtype == tf.resource or dtype == tf.variant or not shape.is_fully_defined():
        return 0
    return int(np.prod(shape.as_list(), dtype=np.int64)) * tf.as_dtype(dtype).size


def _variables_as_handles(graph_def, graph):
    """Turns the captured variable handles (placeholders fed at call time) into VarHandleOps,
    which Grappler's virtual cluster accounts as persistent memory; returns their bytes."""
    captured = {internal.op.name: external for external, internal in graph.captures}
    resources = {t.op.name: t for t in graph.inputs if t.dtype == tf.resource}
    seen, total = set(), 0
    for node in graph_def.node:
        handle = resources.get(node.name)
        if node.op != "Placeholder" or handle is None:
            continue
        data = tf_internals.resource_handle_data(handle)
        dtype, shape = data if data is not None else (tf.float32, tf.TensorShape([]))
        external = captured.get(node.name)
        key = id(external) if external is not None else node.name
        if key not in seen:
            seen.add(key)
            total += _nbytes(dtype, shape)
        shapes = node.attr["_output_shapes"]
        keep = type(shapes)()
        keep.CopyFrom(shapes)
        node.attr.clear()
        node.op = "VarHandleOp"
        node.attr["_output_shapes"].CopyFrom(keep)
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["shape"].shape.CopyFrom(shape.as_proto() if shape.rank is not None
                                          else tf.TensorShape([]).as_proto())
        node.attr["shared_name"].s = node.name.encode()
        node.attr["container"].s = b""
    return total


# Ops whose outputs are their inputs' buffers at run time (output i aliases input i, or
# input 0): they allocate nothing and keep the buffer alive for their consumers.
_ALIASES = frozenset({"Identity", "IdentityN", "Snapshot", "StopGradient", "PreventGradient",
                      "Reshape", "Squeeze", "ExpandDims", "EnsureShape", "CheckNumerics"})
# Outputs that live elsewhere: a variable read aliases the variable's buffer (until a write,
# which copies), inputs and constants exist before the step.
_NOT_ALLOCATED = frozenset({"ReadVariableOp", "VarHandleOp", "Placeholder", "Const",
                            "HostConst", "NoOp"})


def _output_descriptions(step_stats):
    """``{(node, port): (dtype, TensorShape)}`` of every output the simulation produced."""
    found = {}
    for device in step_stats.dev_stats:
        for stat in device.node_stats:
            for output in stat.output:
                description = output.tensor_description
                found[(stat.node_name, output.slot)] = (
                    tf.as_dtype(description.dtype), tf.TensorShape(description.shape))
    return found


def _scratch_intervals(nodes, timing, scratch, threads):
    """``(start, end, bytes)`` of kernels' scratch held in the simulated schedule.

    Two scratch-holding ops that read the same tensor and are next to each other among them
    in the schedule (a convolution's input and filter gradients, both reading the incoming
    gradient) are ready at once, and with two or more inter-op threads the executor may run
    them together:
    the pair then holds both buffers from the first's start to the second's end. Measured on
    one such pair: 57 or 34 MiB in identical runs with two threads (two 32 MiB working sets,
    overlapping or not), 34 MiB with one thread; the simulation counts the overlap.
    """

    def reads(name):
        return {(source, index) for source, index in data_inputs(nodes[name])
                if nodes.get(source) is None or nodes[source].op not in _NOT_ALLOCATED}

    ordered = sorted((name for name in scratch if name in nodes and name in timing),
                     key=lambda name: timing[name])
    intervals, skip = [], False
    for first, second in zip(ordered, ordered[1:] + [None]):
        if skip:
            skip = False
            continue
        if threads > 1 and second is not None and reads(first) & reads(second):
            intervals.append((timing[first][0], timing[second][1], scratch[first] + scratch[second]))
            skip = True
        else:
            intervals.append((*timing[first], scratch[first]))
    return intervals


def inter_op_threads():
    """How many ops TensorFlow's executor may run at once on this machine."""
    return tf.config.threading.get_inter_op_parallelism_threads() or os.cpu_count() or 1


def _replay(graph_def, step_stats, fetched, scratch=None, threads=1):
    """The transient peak, in bytes, of executing ``graph_def`` in the simulated order.

    Grappler's virtual cluster gives each node's start and end time and its outputs' sizes;
    each buffer is allocated when its producer starts and freed when the last consumer of
    it (or of an alias of it) ends; fetched outputs live to the end. ``scratch`` maps node
    names to bytes the node holds while it runs, besides its outputs; ``threads`` is how
    many ops the executor runs at once (see `_scratch_intervals`).
    """
    nodes = {node.name: node for node in graph_def.node}
    timing, sizes = {}, {}
    for device in step_stats.dev_stats:
        for stat in device.node_stats:
            timing[stat.node_name] = (stat.all_start_micros, stat.all_start_micros + stat.op_end_rel_micros)
            for output in stat.output:
                sizes[(stat.node_name, output.slot)] = int(
                    output.tensor_description.allocation_description.requested_bytes)
    buffer_of = {}  # (node, port) -> the (node, port) that owns the buffer

    def owner(tensor):
        while tensor in buffer_of:
            tensor = buffer_of[tensor]
        return tensor

    ordered = sorted(timing, key=lambda name: timing[name])
    for name in ordered:
        node = nodes.get(name)
        if node is None or node.op not in _ALIASES:
            continue
        data = list(data_inputs(node))
        for port in range(len(data) if node.op == "IdentityN" else 1):
            if port < len(data):
                buffer_of[(name, port)] = data[port]
    free_at = {}
    for name in ordered:
        node = nodes.get(name)
        if node is None:
            continue
        end = timing[name][1]
        for tensor in data_inputs(node):
            buffer = owner(tensor)
            free_at[buffer] = max(free_at.get(buffer, 0), end)
    horizon = max((end for _, end in timing.values()), default=0) + 1
    for fetch in fetched:
        for (name, port) in list(sizes):
            if name == fetch:
                free_at[owner((name, port))] = horizon
    events = []
    for (name, port), size in sizes.items():
        node = nodes.get(name)
        if not size or node is None or node.op in _NOT_ALLOCATED or (name, port) in buffer_of:
            continue
        start, end = timing[name]
        events.append((start, 1, size))
        events.append((max(free_at.get((name, port), end), start), 0, -size))
    for start, end, size in _scratch_intervals(nodes, timing, scratch or {}, threads):
        events.append((start, 1, size))
        events.append((max(end, start), 0, -size))
    current = peak = 0
    for _, _, delta in sorted(events):  # frees before allocations at the same instant
        current += delta
        peak = max(peak, current)
    return peak


def simulate_peak(graph, fetches, optimize=True, kernels=None) -> SimulatedPeak:
    """The simulated peak of running ``fetches`` (tensors or ops of ``graph``).

    Args:
      graph: a `tf.Graph` or FuncGraph (its captured variables count as persistent memory,
        its other placeholders as inputs).
      fetches: tensors or operations whose computation is simulated.
      optimize: run Grappler's optimizations first, as TensorFlow does at run time.
      kernels: a device name (``'CPU:0'``, ``'GPU:0'``) to measure the scratch buffers of
        the graph's convolutions and XLA-compiled calls on, running each distinct one once
        alone (`memgrad._src.graph.kernels`); None leaves scratch out.

    Returns:
      A `SimulatedPeak`.
    """
    tf_optimizer, item_module, cluster_module, device_properties_pb2 = tf_internals.grappler()
    graph_def = graph.as_graph_def(add_shapes=True)
    variable_bytes = _variables_as_handles(graph_def, graph)
    input_bytes = sum(_nbytes(t.dtype, t.shape) for t in getattr(graph, "inputs", ())
                      if t.dtype != tf.resource)
    meta = tf.compat.v1.train.export_meta_graph(graph_def=graph_def, graph=graph)
    names = [getattr(f, "op", f).name for f in fetches]
    meta.collection_def["train_op"].node_list.value.extend(dict.fromkeys(names))
    if optimize:
        optimized = tf_optimizer.OptimizeGraph(tf.compat.v1.ConfigProto(), meta, verbose=False,
                                               graph_id=b"memgrad", strip_default_attributes=False)
        meta.graph_def.CopyFrom(optimized)
    item = item_module.Item(meta, ignore_colocation=True)
    device = device_properties_pb2.NamedDevice(
        name=_DEVICE_NAME,
        properties=device_properties_pb2.DeviceProperties(
            type="CPU", frequency=2000, num_cores=1, memory_size=1 << 40, bandwidth=10 << 20))
    cluster = cluster_module.Cluster(devices=[device], disable_timeline=False)
    try:
        _, _, step_stats = cluster.MeasureCosts(item)
    finally:
        cluster.Shutdown()
    scratch = None
    if kernels is not None:
        scratch = kernel_scratch(meta.graph_def, _output_descriptions(step_stats), kernels)
    transient = _replay(meta.graph_def, step_stats, set(names), scratch, inter_op_threads())
    return SimulatedPeak(int(transient + variable_bytes + input_bytes), int(variable_bytes),
                         int(input_bytes))
