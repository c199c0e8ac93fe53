"""Every private TensorFlow and Keras name memgrad uses, in one place.

memgrad uses public APIs wherever one exists (Graph.create_op, graph.device,
control_dependencies, op.op_def.is_stateful, tape.watched_variables(), model.jit_compile,
isinstance(x, tf.Variable), tf.Module.submodules). What is left here has no public
equivalent: the tape's recording switches, the v1 graph-gradient builders, an op's registered
gradient function and default-gradient rules, tf.GradientTape's own state (for the
memgrad.GradientTape subclass), Graph._is_function, Keras's Functional class and the
tf.Variable inside a Keras variable, the profiler's XSpace protobuf, Grappler's optimizer and
virtual cluster (`predict_peak`) and a resource handle's data, and TFP's private
Chain/Invert classes and BatchNormalization's ``_training``. Each is imported through
`_private` (or checked with `_private_member`), so a TensorFlow or Keras release that moves
it fails at ``import memgrad`` with one clear line naming the supported versions instead of a
traceback from deep inside a technique (the TFP ones fail on first use, as TFP is optional).
tests/test_tf_internals.py checks each.
"""

import collections
import contextlib
import importlib
import os
import warnings

import keras
import tensorflow as tf

TF_RANGE = ((2, 16), (2, 21))  # oldest supported, newest tested
KERAS_RANGE = ((3, 0), (3, 15))
SUPPORTED = (
    f"memgrad supports TensorFlow {TF_RANGE[0][0]}.{TF_RANGE[0][1]}-{TF_RANGE[1][0]}.{TF_RANGE[1][1]} "
    f"and Keras {KERAS_RANGE[0][0]}.{KERAS_RANGE[0][1]}-{KERAS_RANGE[1][0]}.{KERAS_RANGE[1][1]} "
    "with the TensorFlow backend"
)


class UnsupportedVersionError(ImportError):
    """TensorFlow or Keras is a version memgrad does not support (or lacks a name it needs)."""


def _version(text):
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _received(tf_version=None, keras_version=None, backend=None):
    return (f"Received: TensorFlow {tf_version or tf.__version__}, Keras "
            f"{keras_version or keras.__version__} (backend {backend or keras.backend.backend()!r})")


def check_versions(tf_version=None, keras_version=None, backend=None):
    """Raises `UnsupportedVersionError` outside the supported range; warns past the tested one.

    Args:
      tf_version, keras_version, backend: what to check (default: the installed ones).

    Returns:
      None.

    Raises:
      UnsupportedVersionError: TensorFlow or Keras too old, Keras 2, or a non-TensorFlow backend.
    """
    tf_v = _version(tf_version or tf.__version__)
    keras_v = _version(keras_version or keras.__version__)
    backend = backend or keras.backend.backend()
    received = _received(tf_version, keras_version, backend)
    if tf_v < TF_RANGE[0] or keras_v < KERAS_RANGE[0] or backend != "tensorflow":
        raise UnsupportedVersionError(f"{SUPPORTED}. {received}")
    if tf_v > TF_RANGE[1] or keras_v > KERAS_RANGE[1]:
        warnings.warn(f"{SUPPORTED}; newer versions are untested. {received}", stacklevel=3)


def _private(module, name=None):
    """``module`` (or ``module.name``), or an `UnsupportedVersionError` saying which is missing."""
    try:
        found = importlib.import_module(module)
        return getattr(found, name) if name else found
    except (ImportError, AttributeError) as error:
        what = f"{module}.{name}" if name else module
        raise UnsupportedVersionError(
            f"{SUPPORTED}: {what} is missing ({error}). {_received()}") from None


def _private_member(owner, name, what):
    """Checks that ``owner`` (a public class, or an instance of one) still has the private
    member ``name``; raises an `UnsupportedVersionError` naming ``what`` if not."""
    if not hasattr(owner, name):
        raise UnsupportedVersionError(
            f"{SUPPORTED}: {what}.{name} is missing. {_received()}")


# The tape's recording switches (tf.recompute_grad and tf.custom_gradient use them too).
stop_recording = _private("tensorflow.python.eager.record", "stop_recording")
could_possibly_record = _private("tensorflow.python.eager.record", "could_possibly_record")
should_record_backprop = _private("tensorflow.python.eager.record", "should_record_backprop")
record_operation = _private("tensorflow.python.eager.record", "record_operation")
# What a generated op wrapper calls after creating an op, so that enclosing tapes record it
# (an op made with Graph.create_op is not recorded, and an outer tape then treats its outputs
# as constants).
_must_record_gradient = _private("tensorflow.python.eager.execute", "must_record_gradient")
_record_gradient = _private("tensorflow.python.eager.execute", "record_gradient")


def record_on_tapes(op):
    """Records ``op``, made with `Graph.create_op`, on every tape that watches one of its
    inputs, as a generated op wrapper does: a tape enclosing the call (a gradient of a
    gradient) then differentiates through it with the op's registered gradient."""
    if not _must_record_gradient():
        return
    attrs = []
    for name in op.node_def.attr:
        attrs.extend((name, op.get_attr(name)))
    _record_gradient(op.type, list(op.inputs), tuple(attrs), list(op.outputs))

# The v1 graph-gradient builders, kept before any monkey patch replaces the public aliases.
tf_gradients_v1 = _private("tensorflow.python.ops.gradients_impl", "gradients")
tf_gradients_v2 = _private("tensorflow.python.ops.gradients_impl", "gradients_v2")

# Graph-gradient internals used by the rewrite.
get_gradient_function = _private("tensorflow.python.framework.ops", "get_gradient_function")
convert_to_tensor = _private("tensorflow.python.framework.ops", "convert_to_tensor")  # as_ref=
is_trainable_dtype = _private("tensorflow.python.eager.backprop_util", "IsTrainable")
supports_default_grad = _private("tensorflow.python.ops.default_gradient", "supports_default_grad")
zeros_like_for_gradient = _private("tensorflow.python.ops.control_flow_state", "ZerosLike")
is_resource_variable = _private("tensorflow.python.ops.resource_variable_ops", "is_resource_variable")
# Whether a graph (or one it is nested in) is being traced for XLA (tf.function(jit_compile=True)
# enters an XLA control-flow context around the trace).
graph_or_parents_in_xla_context = _private("tensorflow.python.ops.control_flow_util",
                                           "GraphOrParentsInXlaContext")

# while_v2 and cond_v2: a loop's gradient is built by `_WhileGrad`, which reads the loop's
# body and condition as FuncGraphs (`_get_graph`) and may rewrite the forward op to output
# per-step accumulators. memgrad.gradients builds a loop's gradient in segments of steps
# (memgrad._src.checkpointing.loops) with the same pieces; TensorFlow exports none of them.
while_gradient = _private("tensorflow.python.ops.while_v2", "_WhileGrad")
while_function_graph = _private("tensorflow.python.ops.while_v2", "_get_graph")
while_zeros_like = _private("tensorflow.python.ops.while_v2", "_zeros_like")
function_graph_of = _private("tensorflow.python.ops.control_flow_util_v2", "get_func_graph")
add_function_to_graph = _private("tensorflow.python.ops.control_flow_util_v2",
                                 "create_new_tf_function")
clear_control_inputs = _private("tensorflow.python.ops.control_flow_util_v2",
                                "clear_control_inputs")
WhileCondFuncGraph = _private("tensorflow.python.ops.control_flow_util_v2", "WhileCondFuncGraph")
FuncGraph = _private("tensorflow.python.framework.func_graph", "FuncGraph")
func_graph_from_py_func = _private("tensorflow.python.framework.func_graph",
                                   "func_graph_from_py_func")
op_def_of = _private("tensorflow.python.framework.op_def_registry", "get")
# A FuncGraph rebuilt from a loop's FunctionDef has no handle data on its resource inputs
# (cond_v2 copies it from the op's inputs; while_v2 does not): without it a nested loop's
# gradient treats a variable it reads as having no gradient.
copy_handle_data = _private("tensorflow.python.ops.handle_data_util", "copy_handle_data")
# A process-wide counter: names of functions added to a graph's library must be unique across
# every graph the process traces (the eager context holds them all).
unique_id = _private("tensorflow.python.framework.ops", "uid")
# Operation's own editing methods (what _WhileGrad uses to add outputs to a forward loop, and
# the control edges `memgrad._src.checkpointing.order` adds) and
# its per-op gradient override, the instance attribute `_gradient_function`, which
# get_gradient_function reads first (checked on an op by tests/test_tf_internals.py).
for _name in ("_set_func_attr", "_set_type_list_attr", "_set_shape_list_attr",
              "_add_while_inputs", "_add_outputs", "_add_control_inputs", "_control_outputs"):
    _private_member(tf.Operation, _name, "tf.Operation")


# tf.gradients' own reachability walk, stop test and sums of gradient parts, which
# memgrad.gradients adjusts within its calls (memgrad._src.checkpointing.gradient_walk).
gradients_util = _private("tensorflow.python.ops.gradients_util")
for _name in ("_Consumers", "_Captures", "_GradientsHelper", "_IsPartitionedCall", "_MultiDeviceAddN"):
    _private_member(gradients_util, _name, "tensorflow.python.ops.gradients_util")
# The generated AddN wrapper every Python sum of tensors ends in (math_ops.add_n, tf.gradients'
# sums, while_v2's): memgrad.gradients orders its inputs while it builds.
gen_math_ops = _private("tensorflow.python.ops.gen_math_ops")
_private_member(gen_math_ops, "add_n", "tensorflow.python.ops.gen_math_ops")


def graph_function_definition(graph, name):
    """The FunctionDef named ``name`` in ``graph``'s library or an enclosing graph's, or None."""
    while graph is not None:
        found = graph._get_function(name)
        if found is not None:
            return found.cached_definition
        graph = getattr(graph, "outer_graph", None)
    return None


# Keras's global SeedGenerator (behind unseeded keras.random.* ops), created on first use:
# `recompute` makes sure it exists before a forward pass it replays, since Keras defers the
# initialisation of a variable created inside a stateless scope.
keras_global_seed_generator = _private("keras.src.random.seed_generator", "global_seed_generator")


# The eager context: TensorFlow creates its devices, and with them the CPU allocator, when the
# first op runs (not at import), reading TF_CPU_ALLOCATOR_USE_BFC then.
_eager_context = _private("tensorflow.python.eager.context", "context")
_private_member(_eager_context(), "_initialized", "tensorflow.python.eager.context.Context")

_CPU_BFC_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"


def devices_started() -> bool:
    """Whether TensorFlow has created its devices (and chosen its CPU allocator) in this process."""
    return bool(_eager_context()._initialized)


def request_cpu_allocator_statistics() -> bool:
    """Asks for TensorFlow's BFC CPU allocator, whose statistics memgrad's profiler reads.

    TensorFlow's default CPU allocator keeps no statistics on CPUs without AVX-512. The BFC
    allocator does; TensorFlow chooses between them when it starts its devices (at the first
    op), from ``TF_CPU_ALLOCATOR_USE_BFC``. So the variable is set here, unless the user set it
    (either way) or the devices have started (then it would not take effect).

    Returns:
      Whether this call set the variable.
    """
    if _CPU_BFC_VARIABLE in os.environ or devices_started():
        return False
    os.environ[_CPU_BFC_VARIABLE] = "true"
    return True


# Whether oneDNN's kernels run: TensorFlow turns them on by itself on CPUs with AVX-512 and reads
# TF_ENABLE_ONEDNN_OPTS (at import) to override that.
onednn_enabled = _private("tensorflow.python.util._pywrap_util_port", "IsMklEnabled")


def grappler():
    """TensorFlow's graph optimizer and its virtual cluster, as ``(tf_optimizer, item,
    cluster, device_properties_pb2)`` (imported on first use: only `predict_peak` needs
    them). Grappler optimizes every tf.function graph before it runs; its virtual cluster
    simulates a graph's execution and reports the peak memory."""
    return (_private("tensorflow.python.grappler.tf_optimizer"),
            _private("tensorflow.python.grappler.item"),
            _private("tensorflow.python.grappler.cluster"),
            _private("tensorflow.core.protobuf.device_properties_pb2"))


def registered_function(name) -> bool:
    """Whether the eager context already holds a function named ``name`` (a graph imported
    with a different definition under that name is refused)."""
    return bool(_private("tensorflow.python.eager.context", "context")().has_function(name))


def resource_handle_data(tensor):
    """The (dtype, shape) of the variable a captured resource handle in a graph points to,
    from the handle data TensorFlow attaches to it, or None."""
    data = _private("tensorflow.python.ops.resource_variable_ops", "get_eager_safe_handle_data")(tensor)
    if data is None or not data.is_set or not data.shape_and_type:
        return None
    entry = data.shape_and_type[0]
    return tf.as_dtype(entry.dtype), tf.TensorShape(entry.shape)


def xplane_pb2():
    """The profiler's XSpace protobuf module (imported on first use: the profiler needs it only
    for `largest_live_tensors`)."""
    return _private("tensorflow.tsl.profiler.protobuf.xplane_pb2")


def tfp():
    """TensorFlow Probability, imported on first use (only `BijectorBlock` needs it)."""
    try:
        import tensorflow_probability
    except ImportError as error:
        raise ImportError(
            "memgrad.layers.BijectorBlock needs TensorFlow Probability: pip install "
            f"'memgrad[tfp]'. Received: {error}") from None
    return tensorflow_probability


def tfp_chain_and_invert():
    """The classes tfb.Chain(...) and tfb.Invert(...) build when a part is not a composite
    tensor (as tfb.BatchNormalization is not): private subclasses ``_Chain`` and ``_Invert``."""
    tfp()
    return (_private("tensorflow_probability.python.bijectors.chain", "_Chain"),
            _private("tensorflow_probability.python.bijectors.invert", "_Invert"))


# tf.GradientTape's own state, which memgrad.GradientTape (a subclass) follows so that a
# non-persistent tape stops recording and computes one set of gradients, as TensorFlow's
# does, and notes which ops it recorded (it extends `_push_tape` / `_pop_tape`, through which
# every start and stop of recording goes). There is no public accessor for "is recording",
# "is persistent" or "pop the tape".
for _name in ("_tape", "_recording", "_persistent", "_pop_tape", "_push_tape",
              "_watch_accessed_variables"):
    _private_member(tf.GradientTape(), _name, "tf.GradientTape")
# Notes the trainable variables read inside it, as a tape does, without recording any op.
VariableWatcher = _private("tensorflow.python.eager.record", "VariableWatcher")


def stop_watching_accessed_variables(tape):
    """Makes ``tape`` (not yet pushed) record no variable read: the tape it pushes watches
    only what is passed to `watch`."""
    tape._watch_accessed_variables = False


def tape_is_spent(tape):
    """Whether the tape has no recording left (a non-persistent tape already used, or one
    never entered): tf.GradientTape raises then."""
    return tape._tape is None


def tape_is_persistent(tape):
    return tape._persistent


def stop_tape_if_recording(tape):
    """What tf.GradientTape.gradient does first: a non-persistent tape called inside its
    ``with`` block stops recording (so the gradient ops are not taped)."""
    if tape._recording and not tape._persistent:
        tape._pop_tape()


_tape_module = "tensorflow.python.eager.tape"
_pop_from_tape_set, _push_to_tape_set = _private(_tape_module, "pop_tape"), _private(_tape_module, "push_tape")


@contextlib.contextmanager
def tapes_set_aside(tapes):
    """Takes the (recording) ``tapes`` off TensorFlow's tape set for the ``with`` block."""
    for tape in tapes:
        _pop_from_tape_set(tape._tape)
    try:
        yield
    finally:
        for tape in tapes:
            _push_to_tape_set(tape._tape)


def release_tape(tape):
    """Drops a non-persistent tape's recording after its one gradient computation."""
    tape._tape = None


# Graph ops' creation numbers: memgrad.GradientTape notes which ops were created while it
# recorded (tf.GradientTape records only those), by the graph's op ids (increasing).
_private_member(tf.Graph(), "_nodes_by_id", "tf.Graph")


def failed_op_creation(error):
    """``(op type, op name, graph)`` if ``error`` escaped TensorFlow's op creation (``_create_c_op``)
    as a C++ exception rather than a Status (a shape function's ``std::out_of_range`` arrives
    as a bare IndexError), else ``None``. Such an exception skips the release of the graph's
    lock (TensorFlow 2.21): the next op made in that graph waits forever."""
    if isinstance(error, (ValueError, tf.errors.OpError)):  # a Status: the lock was released
        return None
    frame, creating = error.__traceback__, None
    while frame is not None:
        if frame.tb_frame.f_code.co_name == "_create_c_op":
            creating = frame
        frame = frame.tb_next
    if creating is None:
        return None
    local = creating.tb_frame.f_locals
    node_def = local.get("node_def")
    return getattr(node_def, "op", "?"), getattr(node_def, "name", "?"), local.get("graph")


def last_op_id(graph):
    """The id of the last op created in ``graph`` (0 for an empty graph); ops created later
    have larger ids."""
    return max(graph._nodes_by_id, default=0)


def op_id(op):
    """``op``'s creation number in its graph (see `last_op_id`)."""
    return op._id


def op_mark(graph, previous=None):
    """``(last op id, op count)`` of ``graph``, for `ops_since`. From a ``previous`` mark it
    reads only the ops made since, not the whole graph (`last_op_id` scans every op)."""
    if previous is None:
        return last_op_id(graph), len(graph._nodes_by_id)
    made = ops_since(graph, previous)
    return max([previous[0]] + [op_id(op) for op in made]), len(graph._nodes_by_id)


def ops_since(graph, mark):
    """The set of ``graph``'s ops made after `op_mark` gave ``mark``. Ops get consecutive
    ids as they are made, so these are usually the next ids; where they are not (a gap
    before as many ops as the count grew by, or an op after them), every op is checked."""
    nodes = graph._nodes_by_id
    since, added = mark[0], len(nodes) - mark[1]
    made = set()
    while len(made) < added:
        i = since + len(made) + 1
        if i not in nodes:
            break
        made.add(nodes[i])
    if len(made) == max(added, 0) and since + len(made) + 1 not in nodes:
        return made
    return {op for i, op in nodes.items() if i > since}


def control_outputs(op):
    """The ops that wait for ``op`` through a control dependency."""
    return op._control_outputs


def add_control_inputs(op, before):
    """Makes the existing ``op`` wait for the ops ``before`` (graph mode, while the graph is
    being built): TensorFlow's public API adds control inputs only to ops not yet made."""
    op._add_control_inputs(before)


# Keras: the functional-model class (keras.Model(inputs, outputs) builds one; `convert`
# rewires only those and Sequential). Keras exports no public class or predicate for it.
keras_functional = _private("keras.src.models.functional", "Functional")


def backend_variable(variable):
    """The `tf.Variable` behind a Keras 3 variable (or ``variable`` itself).

    Keras keeps it in ``_value``; the public ``.value`` is the same object except inside an
    autocast scope (a mixed-precision layer's call), where it is a cast copy.
    """
    if isinstance(variable, tf.Variable):
        return variable
    return getattr(variable, "_value", variable)


def tfp_batchnorm_training(bijector):
    """The ``training`` a ``tfp.bijectors.BatchNormalization`` was built with (TFP keeps it
    in ``_training`` with no public accessor)."""
    _private_member(bijector, "_training", "tfp.bijectors.BatchNormalization")
    return bijector._training


# A TF1-style call of a graph function has the function's name as its op type; whether a
# type names a function of the graph's library has no public query.
_private_member(tf.Graph, "_is_function", "tf.Graph")


def is_graph_function(graph, op_type):
    """Whether ``op_type`` is a function registered in ``graph``'s library."""
    return graph._is_function(op_type)


# Keras's functional graph: the nodes a Functional model runs, in the order its runner
# (keras.src.ops.function.Function._run_through_graph) runs them, and how a node's arguments
# are filled in from computed tensors. `LeanFunctional` runs the same nodes in the same order
# and releases each computed tensor after its last consumer; Keras exports none of these.
_private_member(keras_functional, "_run_through_graph", "keras.src.models.functional.Functional")
# (_nodes_by_depth, _outputs_struct and a node's arguments/outputs are instance attributes,
# checked on the first model a LeanFunctional runs: tests/test_tf_internals.py.)
_keras_node = _private("keras.src.ops.node", "Node")
for _name in ("input_tensors",):  # is_input, arguments, outputs: instance attributes
    _private_member(_keras_node, _name, "keras.src.ops.node.Node")


def functional_nodes_in_order(model):
    """The nodes of a functional ``model`` in the order Keras's runner calls them (input
    nodes left out)."""
    by_depth = model._nodes_by_depth
    return [node for depth in sorted(by_depth, reverse=True) for node in by_depth[depth]
            if node.operation is not None and not node.is_input]


def functional_node_operation(model, node):
    """The operation Keras calls for ``node`` (Keras 3.10+ maps it for NNX; older ones call
    ``node.operation``)."""
    lookup = getattr(model, "_get_operation_for_node", None)
    return lookup(node) if lookup is not None else node.operation


def functional_node_arguments(node, tensors_by_id):
    """``(args, kwargs)`` of ``node`` with its Keras tensors replaced by ``tensors_by_id``."""
    return node.arguments.fill_in(tensors_by_id)


def functional_node_outputs(node):
    """The flat list of symbolic outputs of ``node``."""
    return node.outputs


def functional_outputs_structure(model):
    """The nested structure of a functional model's outputs (Keras keeps it privately)."""
    return model._outputs_struct
