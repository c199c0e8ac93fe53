"""Which tapes record a tensor, with memgrad's own tapes set aside.

A `memgrad.GradientTape` in a graph takes its gradient by differentiating the graph
(`memgrad.gradients`), not from what its TensorFlow tape recorded. So when memgrad asks
"will a tape differentiate this gradient again?" (to choose a loop gradient whose own
gradient a tape gets right), the memgrad tapes recording in the same graph do not count:
the outer call of a gradient of a gradient differentiates the graph, as `tf.gradients`
twice does. Such a tape then must not fall back to its TensorFlow tape's gradient, which
would differentiate TensorFlow's own loop gradient wrongly: it is marked, and raises
instead (`GradientTape._tape_gradient`).
"""

import threading

from memgrad._src import tf_internals

_state = threading.local()


def pushed_tapes():
    """The memgrad tapes pushed in this thread, each with its graph (None: eager)."""
    if not hasattr(_state, "tapes"):
        _state.tapes = []
    return _state.tapes


def note_pushed(tape, graph):
    pushed_tapes().append((tape, graph))


def note_popped(tape):
    _state.tapes = [(other, graph) for other, graph in pushed_tapes() if other is not tape]


def recorded_by_a_tape(tensors, why):
    """Whether a tape other than a memgrad tape of the tensors' graph records ``tensors``.

    A memgrad tape whose recording alone made the answer True is marked with ``why``
    (its fallback to TensorFlow's tape then raises).
    """
    tensors = list(tensors)
    if not tensors or not tf_internals.should_record_backprop(tensors):
        return False
    graph = getattr(tensors[0], "graph", None)
    ours = [tape for tape, where in pushed_tapes()
            if where is not None and where is graph and tape._recording]
    if not ours:
        return True
    with tf_internals.tapes_set_aside(ours):
        others = tf_internals.should_record_backprop(tensors)
    if not others:
        for tape in ours:
            tape._graph_only_reason = tape._graph_only_reason or why
    return bool(others)
