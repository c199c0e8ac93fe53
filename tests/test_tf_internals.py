"""memgrad/_src/tf_internals.py: every private TensorFlow/Keras/TFP name resolves, a missing
one fails with the supported range, and the version check; the fit hook swaps nothing."""

import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad._src import tf_internals
from memgrad._src.checkpointing import gradient_walk
from memgrad._src.tf_internals import UnsupportedVersionError

_NOT_NAMES = {"TF_RANGE", "KERAS_RANGE", "SUPPORTED", "UnsupportedVersionError", "check_versions",
              "importlib", "warnings", "keras", "tf"}
_RANGE = "memgrad supports TensorFlow 2.16-2.21 and Keras 3.0-3.15 with the TensorFlow backend"


def _exported():
    return sorted(name for name in vars(tf_internals)
                  if not name.startswith("_") and name not in _NOT_NAMES)


def test_the_range_in_messages_is_the_declared_one():
    assert tf_internals.SUPPORTED == _RANGE


@pytest.mark.parametrize("name", _exported())
def test_every_exported_name_resolves(name):
    value = getattr(tf_internals, name)
    assert callable(value) or isinstance(value, types.ModuleType), f"{name} is {value!r}"


@pytest.mark.slow  # imports TensorFlow Probability (about 10 s)
def test_lazy_names_resolve_to_what_memgrad_uses():
    assert hasattr(tf_internals.xplane_pb2(), "XSpace")
    tfp = tf_internals.tfp()
    chain_cls, invert_cls = tf_internals.tfp_chain_and_invert()
    bn = tfp.bijectors.BatchNormalization(training=False)
    assert isinstance(tfp.bijectors.Chain([tfp.bijectors.Exp(), bn]), chain_cls)
    assert isinstance(tfp.bijectors.Invert(bn), invert_cls)
    assert tf_internals.tfp_batchnorm_training(bn) is False
    tf_optimizer, item, cluster, device_properties_pb2 = tf_internals.grappler()
    assert callable(tf_optimizer.OptimizeGraph) and hasattr(cluster.Cluster, "DeterminePeakMemoryUsage")
    assert hasattr(item, "Item") and hasattr(device_properties_pb2, "NamedDevice")


def test_private_on_a_missing_module_names_the_range_and_the_versions():
    with pytest.raises(UnsupportedVersionError) as raised:
        tf_internals._private("tensorflow.python.no_such_module_memgrad")
    message = str(raised.value)
    assert _RANGE in message
    assert "tensorflow.python.no_such_module_memgrad is missing" in message
    assert f"Received: TensorFlow {tf.__version__}, Keras {keras.__version__}" in message
    assert isinstance(raised.value, ImportError)  # an import-time failure, catchable as one


def test_private_on_a_missing_attribute_names_the_range_and_the_versions():
    with pytest.raises(UnsupportedVersionError) as raised:
        tf_internals._private("tensorflow.python.eager.record", "no_such_switch")
    message = str(raised.value)
    assert _RANGE in message and "tensorflow.python.eager.record.no_such_switch is missing" in message
    assert f"Received: TensorFlow {tf.__version__}, Keras {keras.__version__}" in message


def test_private_member_on_a_missing_member_names_the_range():
    with pytest.raises(UnsupportedVersionError, match=r"tf.GradientTape._no_such_member is missing"):
        tf_internals._private_member(tf.GradientTape, "_no_such_member", "tf.GradientTape")
    tf_internals._private_member(tf.GradientTape, "_pop_tape", "tf.GradientTape")  # present


@pytest.mark.parametrize("versions, received", [
    (dict(tf_version="2.15.0"), "TensorFlow 2.15.0"),
    (dict(keras_version="2.15.0"), "Keras 2.15.0"),
    (dict(backend="jax"), "(backend 'jax')"),
])
def test_check_versions_rejects_unsupported(versions, received):
    with pytest.raises(UnsupportedVersionError) as raised:
        tf_internals.check_versions(**versions)
    assert _RANGE in str(raised.value) and received in str(raised.value)


def test_check_versions_warns_past_the_tested_range_and_accepts_the_installed_one():
    with pytest.warns(UserWarning, match=r"newer versions are untested. Received: TensorFlow 2.99.0"):
        tf_internals.check_versions(tf_version="2.99.0")
    with pytest.warns(UserWarning, match=r"Keras 3.99.1"):
        tf_internals.check_versions(keras_version="3.99.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tf_internals.check_versions()
        tf_internals.check_versions(tf_version="2.16.1", keras_version="3.0.0",
                                    backend="tensorflow")


def test_tape_helpers_follow_tf_gradient_tape():
    x = tf.constant(3.0)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = x * x
        assert not tf_internals.tape_is_spent(tape)
        assert not tf_internals.tape_is_persistent(tape)
        tf_internals.stop_tape_if_recording(tape)
        z = y * x  # not recorded any more
    assert float(tape.gradient(y, x)) == 6.0
    with tf.GradientTape(persistent=True) as kept:
        kept.watch(x)
        y = x * x
        tf_internals.stop_tape_if_recording(kept)  # a persistent tape keeps recording
        z = y * x
    assert tf_internals.tape_is_persistent(kept)
    assert float(kept.gradient(z, x)) == 27.0
    tf_internals.release_tape(kept)
    assert tf_internals.tape_is_spent(kept)
    assert tf_internals.tape_is_spent(tf.GradientTape())  # never entered


def test_is_graph_function_sees_the_library():
    @tf.function
    def inner(x):
        return x * 2.0

    @tf.function
    def outer(x):
        return inner(x) + 1.0

    graph = outer.get_concrete_function(tf.constant(1.0)).graph
    calls = [op for op in graph.get_operations() if op.type.endswith("PartitionedCall")]
    assert calls
    name = calls[0].get_attr("f").name
    assert tf_internals.is_graph_function(graph, name)
    assert not tf_internals.is_graph_function(graph, "MatMul")


def test_backend_variable_and_functional_class():
    variable = keras.Variable(np.ones(3, "float32"))
    inner = tf_internals.backend_variable(variable)
    assert isinstance(inner, tf.Variable) and inner is not variable
    plain = tf.Variable(1.0)
    assert tf_internals.backend_variable(plain) is plain
    inputs = keras.Input((2,))
    functional = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    assert isinstance(functional, tf_internals.keras_functional)
    assert not isinstance(keras.Sequential([keras.layers.Dense(1)]), tf_internals.keras_functional)


def test_fit_hook_swaps_nothing_process_wide():
    from keras.src.backend.tensorflow import trainer

    keras_step = trainer.TensorFlowTrainer.train_step
    inputs = keras.Input((8,))
    h = inputs
    for _ in range(6):
        h = keras.layers.Dense(8, activation="tanh")(h)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    model.compile(optimizer="sgd", loss="mse")
    memgrad.enable_checkpointing(model)
    model.fit(np.ones((8, 8), "float32"), np.zeros((8, 1), "float32"), verbose=0)
    assert trainer.tf is tf, "Keras's trainer module no longer sees the real tensorflow module"
    assert trainer.TensorFlowTrainer.train_step is keras_step
    assert keras.Model.train_step is keras_step
    assert tf.GradientTape is not memgrad.GradientTape
    memgrad.disable_checkpointing(model)


def test_an_ops_own_gradient_function_overrides_the_registered_one():
    """memgrad differentiates a forward loop by setting the op's `_gradient_function`,
    which TensorFlow's gradient lookup reads before the registry."""
    x = tf.constant([1.0, 2.0])
    calls = []

    @tf.function
    def step(x):
        y = tf.sin(x)
        y.op._gradient_function = lambda op, grad: calls.append(op.type) or grad * 10.0
        return tf.gradients(tf.reduce_sum(y), [x])[0]

    np.testing.assert_allclose(step(x).numpy(), [10.0, 10.0])
    assert calls == ["Sin"]


def test_a_rebuilt_loop_body_lacks_handle_data_until_copied():
    """The gap memgrad patches (loops._give_fresh_graphs): a loop body rebuilt from its
    FunctionDef has resource inputs without handle data, so default gradients of a variable
    a nested loop reads would be missing; copy_handle_data restores it."""
    variable = tf.Variable(tf.ones([2, 2]))
    found = []

    @tf.function
    def step(x):
        def body(i, c):
            return i + 1, c @ variable

        _, c = tf.while_loop(lambda i, c: i < 3, body, (0, x))
        loop = c.op
        rebuilt = tf_internals.function_graph_of(
            loop, [tf.TensorShape(s) for s in loop.get_attr("output_shapes")],
            loop.get_attr("body").name)
        handles = [(outer, inner) for outer, inner in zip(loop.inputs, rebuilt.inputs)
                   if outer.dtype == tf.resource]
        found.append([tf_internals.resource_handle_data(inner) for _, inner in handles])
        for outer, inner in handles:
            tf_internals.copy_handle_data(outer, inner)
        found.append([tf_internals.resource_handle_data(inner) for _, inner in handles])
        return c

    step(tf.ones([2, 2]))
    assert found[0] == [None]  # if TensorFlow starts copying it, the patch can go
    assert found[1] == [(tf.float32, tf.TensorShape([2, 2]))]


def test_indexed_captures_finds_the_consumers_tensorflows_scan_finds():
    from tensorflow.python.framework.func_graph import FuncGraph
    from tensorflow.python.ops import gradients_util

    outer = tf.Graph()
    with outer.as_default():
        a, c = tf.constant(1.0), tf.constant(2.0)
        inner = FuncGraph("inner")
        with inner.as_default():
            doubled = inner.capture(a) * 2.0
            for i in range(50):  # other captures the scan walks past
                inner.capture(tf.constant(float(i)))

    def both(t):
        original = gradients_util._Consumers(t, [inner])
        with gradient_walk.indexed_captures():
            assert gradients_util._Consumers is not original
            indexed = gradients_util._Consumers(t, [inner])
        return original, indexed

    original, indexed = both(a)
    assert indexed == original == [doubled.op]
    assert both(c) == ([], [])
    with gradient_walk.indexed_captures():  # a capture added inside the block is found
        assert gradients_util._Consumers(c, [inner]) == []
        with inner.as_default():
            tripled = inner.capture(c) * 3.0
        assert gradients_util._Consumers(c, [inner]) == [tripled.op]
    assert gradients_util._Consumers.__module__ == gradients_util.__name__  # restored


def test_variant_gradient_parts_are_summed_with_the_bare_ones_first():
    """AddN's shape function throws (a bare IndexError, the graph left locked) on variants
    whose last lacks handle data while two others have it: the sum a gradient of a gradient
    through loops can make. memgrad's own sums (`aggregate`) and TensorFlow's inside
    memgrad.gradients (`ordered_gradient_sums`) put the bare ones first; the values are
    the same sums."""
    from tensorflow.python.ops import gradients_util, list_ops

    from memgrad._src.checkpointing.aggregate import aggregate

    def as_list(t):
        return list_ops.tensor_list_from_tensor(t, element_shape=[3])

    found = {}

    @tf.function(autograph=False)
    def sums(x):
        bare = tf.compat.v1.placeholder_with_default(as_list(4.0 * x), shape=[])  # drops it
        parts = [as_list(x), as_list(2.0 * x), bare]
        found["has"] = [tf_internals.resource_handle_data(p) is not None for p in parts]
        found["bare at"] = [o is bare for o in gradient_walk.add_n_order(parts)]
        with gradient_walk.ordered_gradient_sums():
            by_tensorflow = gradients_util._MultiDeviceAddN(parts, "uid")
            by_add_n = tf.math.add_n(parts)  # any Python AddN while memgrad builds (while_v2's too)
        return [list_ops.tensor_list_stack(s, tf.float32, element_shape=[3])
                for s in (aggregate(parts), by_tensorflow, by_add_n)]

    x = tf.reshape(tf.range(12, dtype=tf.float32), [4, 3])
    summed = sums(x)
    assert len(summed) == 3
    for each in summed:
        np.testing.assert_array_equal(each.numpy(), 7.0 * x.numpy())
    assert found == {"has": [True, True, False], "bare at": [True, False, False]}
    assert tf_internals.gen_math_ops.add_n.__module__ == tf_internals.gen_math_ops.__name__  # restored


def test_ops_since_a_mark_are_exactly_the_ops_made_after_it():
    graph = tf.Graph()
    with graph.as_default():
        a = tf.constant(1.0)
        mark = tf_internals.op_mark(graph)
        b = a + 1.0
        c = b * 2.0
        made = {op for op in graph.get_operations() if tf_internals.op_id(op) > mark[0]}
        assert made >= {b.op, c.op}
        assert tf_internals.ops_since(graph, mark) == made
        # A mark whose count is off either way (ids with a gap, ops removed) takes the full
        # scan: the same ops.
        assert tf_internals.ops_since(graph, (mark[0], mark[1] - 3)) == made
        assert tf_internals.ops_since(graph, (mark[0], mark[1] + 1)) == made
        later = tf_internals.op_mark(graph, mark)
        assert later == tf_internals.op_mark(graph)
        d = c - 1.0  # a Sub and its constant
        assert tf_internals.ops_since(graph, later) == {d.op, d.op.inputs[1].op}
