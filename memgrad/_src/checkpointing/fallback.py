"""When `memgrad.gradients` gives up its rewrite: the reasons it takes plain `tf.gradients`.

The house rule: where the rewrite cannot handle a graph, plain `tf.gradients` runs with one
warning naming why, never a wrong or missing gradient and never a traceback from inside
memgrad. These checks say why: TensorFlow 1 control flow, xs the ys reach only through an
enclosing graph's captures, an internal failure while planning or building, and a gradient
the rewrite lost that `tf.gradients` computes.
"""

import linecache
import os

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.checkpointing.budget_planner import BudgetError
from memgrad._src.checkpointing.strategies import is_built_in


# Any error raised while the rewrite is built (a graph it cannot handle: a cycle among
# checkpoints, a missing key, a TensorFlow gradient function failing on a copy) makes
# memgrad.gradients fall back to plain tf.gradients for that graph, with a warning. While a
# plan is made, only internal failures do (`is_internal_failure`).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def crash_reason(stage, error):
    """The fallback reason for ``error``, raised by memgrad while ``stage``."""
    message = str(error).strip().splitlines()
    return (f"{stage} raised {type(error).__name__}: {message[0] if message else ''}"
            " (a memgrad bug: please report it)")


def is_internal_failure(error, strategy):
    """Whether ``error``, raised while a plan was made, is memgrad's failure (fall back) and
    not the caller's (raised again).

    The caller's: a `BudgetError` (no plan fits the budget), anything a user strategy (a
    class defined outside memgrad) raises, and the TypeError or ValueError memgrad's own
    argument checks raise (a `'collection'` with nothing marked, a list of checkpoints
    that are no forward tensors), recognized by the innermost frame being a ``raise``
    statement in memgrad (a builtin failing inside memgrad, ``max([])``, is not one).
    Everything else (an AssertionError, a KeyError, a networkx error, an error from deep
    inside TensorFlow) is an internal failure.
    """
    if isinstance(error, BudgetError):
        return False
    if not is_built_in(strategy):
        return False
    if isinstance(error, (TypeError, ValueError)):
        frame = error.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        if frame is not None:
            path = os.path.abspath(frame.tb_frame.f_code.co_filename)
            # A `raise` statement of memgrad's: an argument check. A builtin failing inside
            # memgrad (`max([])`, an unpacking) leaves the line that called it instead.
            line = linecache.getline(path, frame.tb_lineno).strip()
            if path.startswith(_PACKAGE_DIR + os.sep) and line.startswith("raise "):
                return False
    return True


# TensorFlow 1 control flow (tf.compat.v1 with control flow v1): frames the rewrite can
# neither copy nor cut.
_V1_CONTROL_FLOW = frozenset({
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
    "NextIteration", "RefNextIteration", "LoopCond",
})


def unsupported_op(view):
    """Why the rewrite cannot handle ``view``'s graph (naming the op), or None."""
    for op in view.ops:
        if op.type in _V1_CONTROL_FLOW:
            return (f"op '{op.name}' ({op.type}) is TensorFlow 1 control flow, which the "
                    "rewrite can neither copy nor cut")
    return None


def outside_graph_of_ys(ys, xs):
    """Why the rewrite cannot see every path from ``xs`` to ``ys``, or None.

    Inside a `tf.while_loop` body or a `tf.cond` branch (a FuncGraph nested in another),
    the ys may depend on an x of an enclosing graph through a captured tensor. tf.gradients
    follows captures into the enclosing graphs; the rewrite reads only the ys' own graph, so
    it would give such an x no gradient (or miss the paths through the enclosing graph).
    That is when a tensor x belongs to another graph than the ys, or the ys' graph captures
    a tensor an enclosing graph computed from a variable among the xs.
    """
    graph = ys[0].graph
    for i, x in enumerate(xs):
        if tf.is_symbolic_tensor(x) and x.graph is not graph:
            return (f"xs[{i}] ('{x.name}') belongs to a graph enclosing the ys' (the ys are "
                    "computed inside a tf.while_loop body, a tf.cond branch or a nested "
                    "function, which reaches it through a captured tensor), which the "
                    "rewrite does not follow")
    handles = {}
    for i, x in enumerate(xs):
        if not tf.is_symbolic_tensor(x) and hasattr(x, "handle"):
            handles.setdefault(id(_origin(x.handle)), i)
    if not handles:
        return None
    for captured in _symbolic_captures(graph):
        seen = set()
        stack = [captured]
        while stack:
            t = stack.pop()
            if t.op in seen:
                continue
            seen.add(t.op)
            for source in t.op.inputs:
                index = handles.get(id(_origin(source))) if source.dtype == tf.resource else None
                if index is not None:
                    return (f"the ys' graph captures '{captured.name}', which an enclosing "
                            f"graph computes from xs[{index}] (the ys are computed inside a "
                            "tf.while_loop body, a tf.cond branch or a nested function), a "
                            "path the rewrite does not follow")
            stack.extend(t.op.inputs)
            if t.op.type == "Placeholder":
                stack.extend(_symbolic_captures(t.graph, only=t))
    return None


def _symbolic_captures(graph, only=None):
    """The tensors of enclosing graphs that ``graph`` (a FuncGraph) captures (as ``only``)."""
    captures = getattr(graph, "captures", None) or []
    return [external for external, internal in captures
            if tf.is_symbolic_tensor(external) and (only is None or internal is only)]


def _origin(t):
    """The tensor an enclosing graph holds for ``t``, a capture (followed out), or ``t``."""
    while tf.is_symbolic_tensor(t) and t.op.type == "Placeholder":
        outer = [e for e, internal in (getattr(t.graph, "captures", None) or [])
                 if internal is t]
        if not outer:
            break
        t = outer[0]
    return t


def lost_gradients(ys, xs, grads, grad_ys, stop_gradients):
    """Checks the rewrite's invariant: no x gets None where tf.gradients gives a gradient.

    Only the xs the rewrite left without a gradient are checked, with TensorFlow's own
    tf.gradients (its ops are pruned unless used). Returns a reason naming the first x
    that lost its gradient, or None.
    """
    missing = [i for i, g in enumerate(grads) if g is None]
    if not missing:
        return None
    reference = tf_internals.tf_gradients_v1(
        ys, [xs[i] for i in missing], grad_ys=grad_ys, stop_gradients=stop_gradients or None,
        name="memgrad_check")
    for i, g in zip(missing, reference):
        if g is not None:
            x = xs[i]
            label = getattr(x, "name", None) or repr(x)
            return (f"the rewrite lost the gradient of xs[{i}] ('{label}'), which "
                    "tf.gradients computes (a memgrad bug: please report it)")
    return None
