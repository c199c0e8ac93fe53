"""tf.gradients' internals as memgrad.gradients uses them: its reachability walk with captures
indexed (`indexed_captures`), its stop test holding at function calls (`stops_at_calls`), its
sums of gradient parts in an order TensorFlow's AddN accepts (`ordered_gradient_sums`), and
a gradient built in another graph than its sources' (`gradients_across_graphs`). Each swap
lasts for a ``with`` block; the private names come from `memgrad._src.tf_internals`.
"""

import collections
import contextlib
import threading

import tensorflow as tf

from memgrad._src import tf_internals

gradients_util = tf_internals.gradients_util


def add_n_order(tensors):
    """``tensors`` in an order TensorFlow's AddN accepts: variants with handle data last.

    AddN's shape function (TensorFlow 2.21) throws a C++ out-of-range error, a bare
    IndexError in Python, when it sums variants (TensorList gradients of loops) of which
    the last carries no handle data and two or more others do, and the failed op creation
    leaves the graph locked: the next op made in it waits forever. A gradient of a gradient
    through loops sums such parts (one loop gradient's list keeps its element shape, another
    has none). Summing is commutative, so the parts with handle data go last, in their order.
    """
    if len(tensors) < 3 or any(getattr(t, "dtype", None) != tf.variant or not tf.is_symbolic_tensor(t)
                               for t in tensors):
        return list(tensors)
    return sorted(tensors, key=lambda t: tf_internals.resource_handle_data(t) is not None)  # stable


# Held while any swap below is in place. Re-entrant: one thread nests swaps (memgrad.gradients
# orders its sums around the rewrite, which indexes captures and stops at calls inside). A
# second thread that builds memgrad gradients waits for the first to finish instead of saving
# the first one's replacement as the "original" and restoring it when the first has left.
_swap_lock = threading.RLock()


@contextlib.contextmanager
def _swapped_in(module, name, replacement):
    """Within the block, ``module.<name>`` is ``replacement(original)``; restored after, on
    every exit path. Other threads' swaps wait (`_swap_lock`)."""
    with _swap_lock:
        original = getattr(module, name)
        setattr(module, name, replacement(original))
        try:
            yield
        finally:
            setattr(module, name, original)


def _swapped(name, replacement):
    """`_swapped_in` TensorFlow's ``gradients_util``."""
    return _swapped_in(gradients_util, name, replacement)


@contextlib.contextmanager
def ordered_gradient_sums():
    """Within the block, every AddN made from Python (``tf.gradients``' sums of a tensor's
    gradient parts, ``math_ops.add_n``, while_v2's gradient sums) takes its inputs in
    `add_n_order`: a failing AddN shape function would leave the graph locked for good."""
    with _swapped("_MultiDeviceAddN", lambda original: lambda tensor_list, gradient_uid: original(
            add_n_order(tensor_list), gradient_uid)):
        with _swapped_in(tf_internals.gen_math_ops, "add_n", lambda original: lambda inputs, name=None: original(
                add_n_order(inputs), name=name)):
            yield


def gradients_across_graphs(ys, xs, grad_ys, src_graph, stop_gradients=None):
    """``tf.gradients(ys, xs, grad_ys)`` for ys and xs of ``src_graph``, built in the default
    graph (a function's backward graph reading the forward graph's tensors through its
    captures), as TensorFlow builds a `tf.function`'s gradient."""
    return gradients_util._GradientsHelper(ys, xs, grad_ys=grad_ys, stop_gradients=stop_gradients,
                                            src_graph=src_graph)


class _CaptureIndex:
    """``_Consumers`` with each FuncGraph's captures indexed by the captured tensor.

    TensorFlow's ``_Consumers`` (the reachability walk of every ``tf.gradients`` call inside a
    ``tf.function``) scans the list of all of the graph's captures for each tensor it visits:
    on a model with thousands of captured weights that scan is most of a gradient call's
    bookkeeping, and the rewrite makes one call per segment. The answer here is the same (the
    same consumers in the same order): the index is rebuilt whenever the graph's list of
    captures is a new list, which TensorFlow makes on every change.
    """

    def __init__(self):
        self._indexes = {}  # id(graph) -> (captures list the index was built from, index)

    def _placeholders(self, graph, t):
        captures = gradients_util._Captures(graph)
        built = self._indexes.get(id(graph))
        if built is None or built[0] is not captures:
            index = collections.defaultdict(list)
            for external, internal in captures:
                index[id(external)].append((external, internal))
            built = self._indexes[id(graph)] = (captures, index)
        return [internal for external, internal in built[1].get(id(t), ()) if external is t]

    def consumers(self, t, func_graphs):
        found = t.consumers()
        for graph in func_graphs:
            for placeholder in self._placeholders(graph, t):
                found.extend(self.consumers(placeholder, func_graphs))
        return found


def indexed_captures():
    """Within the block, ``tf.gradients``' reachability walk looks captures up in an index
    (`_CaptureIndex`) instead of scanning them: same gradients, built in time linear in the
    graph."""
    return _swapped("_Consumers", lambda original: _CaptureIndex().consumers)


def stops_at_calls(stop_gradients):
    """Within the block, ``tf.gradients(..., stop_gradients=stop_gradients)`` stops at an
    output of a function call too.

    TensorFlow's walk skips the gradient function of an op in its stop set, but for a
    function call (PartitionedCall, StatefulPartitionedCall) it then builds a
    SymbolicGradient node and adds its result to the call's inputs' gradients: the gradient
    is not stopped. Where one stopped source is computed from another by a call, the other
    source's gradient counts the path through the call (silently wrong for a caller that
    routes each source's gradient on separately), and a call holding a loop fails at run
    time (NotFoundError: SymbolicGradient). Here the walk sees those calls as ordinary ops,
    which the stop set stops."""
    stopped = {t.op for t in stop_gradients or ()}
    return _swapped("_IsPartitionedCall", lambda original: lambda op: op not in stopped and original(op))
