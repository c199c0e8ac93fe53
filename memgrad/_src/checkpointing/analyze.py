"""`memgrad.analyze`: what the checkpoint rewrite would see and choose, without running it."""

import dataclasses
import re
import time

import tensorflow as tf

from memgrad._src.checkpointing.budget_planner import budget_curve
from memgrad._src.checkpointing.strategies import choose
from memgrad._src.graph.memory_model import MemoryModel
from memgrad._src.graph.view import ForwardGraph
from memgrad._src.arguments import positional_args
from memgrad._src.names import layer_of
from memgrad._src.units import format_bytes


@dataclasses.dataclass
class Analysis:
    """The analyzer's findings for one forward computation.

    Attributes:
      graph_ops: ops in the whole graph.
      forward_ops: ops on a path from xs to ys.
      activation_ops: forward ops carrying activations (not parameter arithmetic).
      separators: names of single-tensor separators, in forward order.
      checkpoints: names of the tensors the strategy keeps, in forward order.
      checkpoint_layers: the layer (name scope) each checkpoint comes out of, in the same
        order, e.g. ``'resnet50/conv3_block1_out'`` for a Keras model's layer; a tensor made
        outside any layer gives its op's name.
      segments: how many segments the checkpoints cut the forward pass into.
      activation_bytes: estimated activation bytes plain backprop may keep.
      estimated_bytes: estimated activation peak with the chosen checkpoints.
      forward_flops: estimated floating-point operations of the forward pass.
      seconds: time the analysis took.
      plan: the `CheckpointPlan` itself (tensors included).
      predicted_bytes: the memory model's predicted activation peak with the plan
        (`memgrad._src.graph.MemoryModel`: saved tensors, gradient partials, later parameter
        gradients), and `plain_predicted_bytes` without checkpoints.
      recomputed_flops: FLOPs the plan runs again in backward, as the memory model predicts
        them: the ops of each recomputed segment whose copies run (not a segment's last
        matrix product before its kept ReLU, which no gradient reads).
        `memgrad.RewriteRecord.recomputed_flops` holds what the rewrite's copies compute.
      curve: the budget curve, a list of `memgrad._src.checkpointing.CurvePoint`: for budgets
        from the smallest feasible one to plain backprop's peak, the predicted peak and
        extra compute of the cheapest plan within each.
    """

    graph_ops: int
    forward_ops: int
    activation_ops: int
    separators: list
    checkpoints: list
    segments: int
    activation_bytes: float
    estimated_bytes: float
    forward_flops: float
    seconds: float
    plan: object = dataclasses.field(repr=False, default=None)
    predicted_bytes: float = 0.0
    plain_predicted_bytes: float = 0.0
    recomputed_flops: float = 0.0
    curve: list = dataclasses.field(default_factory=list)
    checkpoint_layers: list = dataclasses.field(default_factory=list)

    @property
    def estimated_ratio(self):
        """Estimated activation peak with checkpoints over without."""
        return self.estimated_bytes / self.activation_bytes if self.activation_bytes else 1.0

    def summary(self, limit=8):
        """A readable report.

        Args:
          limit: how many separator and checkpoint names to list.

        Returns:
          A multi-line string.
        """
        def names(items):
            shown = ", ".join(items[:limit])
            more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
            return (shown + more) or "none"

        return "\n".join([
            f"ops in graph:           {self.graph_ops}",
            f"forward ops (xs -> ys): {self.forward_ops} ({self.activation_ops} on activations)",
            f"forward cost:           {self.forward_flops / 1e6:.1f} MFLOP (estimated)",
            f"separators found:       {len(self.separators)}: {names(self.separators)}",
            f"checkpoints chosen:     {len(self.checkpoints)} ({self.plan.mode}), "
            f"{self.segments} segments: {names(self.checkpoints)}",
            f"kept after layers:      {names(_unique(self.checkpoint_layers))}",
            f"activation memory:      {format_bytes(self.activation_bytes)} without, "
            f"{format_bytes(self.estimated_bytes)} with checkpoints "
            f"({self.estimated_ratio:.2f}x, estimated)",
            f"predicted peak:         {format_bytes(self.predicted_bytes)} with the plan, "
            f"{format_bytes(self.plain_predicted_bytes)} plain; "
            f"recomputes {self.recomputed_flops / 1e6:.1f} MFLOP",
            f"analysis time:          {self.seconds * 1e3:.0f} ms",
        ] + self._curve_lines())

    def _curve_lines(self):
        if not self.curve:
            return []
        lines = ["budget curve (memgrad.strategies.Budget):",
                 f"  {'budget':>12}  {'predicted peak':>14}  {'extra compute':>13}  kept"]
        for p in self.curve:
            if p.predicted_bytes is None:
                lines.append(f"  {format_bytes(p.budget_bytes):>12}  {'no plan fits':>14}")
                continue
            lines.append(
                f"  {format_bytes(p.budget_bytes):>12}  {format_bytes(p.predicted_bytes):>14}  "
                f"{p.extra_compute:>12.0%}  {p.checkpoints:>4}")
        return lines

    def __str__(self):
        return self.summary()


def _unique(items):
    """`items` without repeats, in order."""
    return list(dict.fromkeys(items))


_HELPER_SCOPE = re.compile(r"^[A-Z][A-Za-z0-9]*(_\d+)?$")


def _layer_name(tensor):
    """The layer a tensor comes out of (its op's name scope), or its op's name.

    Trailing CamelCase scopes are TensorFlow's helpers inside a layer (``Tensordot``), not
    layers: Keras names layers in snake_case.
    """
    parts = layer_of(tensor.op.name).split("/")
    while len(parts) > 1 and _HELPER_SCOPE.match(parts[-1]):
        parts.pop()
    return "/".join(parts) or tensor.op.name


def _concrete(fn, args, kwargs):
    if hasattr(fn, "graph") and hasattr(fn, "structured_outputs"):
        return fn
    if not callable(fn):
        raise TypeError(
            "analyze expects a function returning the loss, a tf.function or a concrete "
            f"function. Received: {type(fn).__name__}"
        )
    if not hasattr(fn, "get_concrete_function"):
        fn = tf.function(fn)
    return fn.get_concrete_function(*args, **kwargs)


def _from_function(fn, args, kwargs):
    concrete = _concrete(fn, args, kwargs)
    graph = concrete.graph
    ys = [t for t in tf.nest.flatten(concrete.structured_outputs)
          if tf.is_symbolic_tensor(t) and t.dtype.is_floating]
    if not ys:
        raise ValueError(
            "analyze needs the function to return a floating-point tensor (the loss). "
            f"Received outputs: {concrete.structured_outputs!r}"
        )
    captured = {id(external): internal for external, internal in graph.captures}
    xs = []
    for v in graph.trainable_variables:
        handle = captured.get(id(v.handle))
        if handle is not None:
            xs.append(handle)
    if not xs:
        raise ValueError(
            "analyze found no trainable variable read by the function; pass ys= and xs= "
            "inside a graph to analyze gradients with respect to tensors."
        )
    return ys, xs


@tf.autograph.experimental.do_not_convert
def analyze(fn=None, *positional, args=None, kwargs=None, ys=None, xs=None,
            checkpoints="memory", budget_points=6, **keywords):
    """Trace a computation, find its separators and the checkpoints a strategy would keep.

    Call it one of three ways: with a Python function returning the loss and example
    arguments (it is traced with `tf.function`; gradients are taken with respect to the
    trainable variables it reads); with a `tf.function` or concrete function; or, inside a
    graph, with `ys=` and `xs=`.

    The example arguments are given as in `memgrad.profiler.measure`: ``args=`` (a tuple or
    list, or one tensor or array standing for the one argument) and ``kwargs=`` (a dict).
    The older form, ``analyze(fn, x, y, training=True)`` with the arguments inline, still
    works; it cannot pass ``fn`` a keyword argument named like one of analyze's own
    (``args``, ``kwargs``, ``ys``, ``xs``, ``checkpoints``, ``budget_points``): use
    ``kwargs=`` for those. The two forms cannot be mixed in one call.

    Args:
      fn: a function returning the loss, a `tf.function`, or a concrete function.
      *positional: (older form) example positional arguments for tracing `fn`.
      args: example positional arguments for tracing `fn`: a tuple or list, or a single
        tensor or NumPy array passed as the one argument.
      kwargs: a dict of example keyword arguments for tracing `fn`.
      ys: (graph form) tensors to differentiate.
      xs: (graph form) tensors or variables.
      checkpoints: the strategy to evaluate (see `memgrad.gradients`).
      budget_points: how many budgets the budget curve evaluates (0: no curve).
      **keywords: (older form) example keyword arguments for tracing `fn`.

    Returns:
      An `Analysis`; `print(analysis)` shows the summary.

    Raises:
      TypeError: ``args`` or ``kwargs`` of the wrong type, or both forms in one call.
      ValueError: neither a function nor ``ys=`` and ``xs=``, or both; example arguments
        in the graph form; nothing connects xs to ys.

    Example:
      ```python
      model = keras.Sequential([keras.layers.Dense(256, activation="relu")] * 32)
      report = memgrad.analyze(lambda x: tf.reduce_sum(model(x)), args=(tf.ones([64, 256]),))
      print(report)
      ```
    """
    start = time.perf_counter()
    if args is not None and positional:
        raise TypeError(
            "analyze takes example arguments either as args= or inline after fn, not both. "
            f"Received args={args!r} and {len(positional)} inline argument(s)")
    if kwargs is not None and keywords:
        raise TypeError(
            "analyze takes example keyword arguments either as kwargs= or inline, not both. "
            f"Received kwargs={kwargs!r} and inline {sorted(keywords)}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"Expected kwargs to be a dict of keyword arguments. Received: {kwargs!r}")
    call_args = positional_args(args) if args is not None else positional
    call_kwargs = dict(kwargs) if kwargs is not None else keywords
    if fn is not None:
        if ys is not None or xs is not None:
            raise ValueError("Pass either a function or ys= and xs=, not both.")
        ys, xs = _from_function(fn, call_args, call_kwargs)
    elif ys is None or xs is None:
        raise ValueError(
            "analyze needs a function (with example arguments) or both ys= and xs=. "
            f"Received fn=None, ys={ys!r}, xs={xs!r}"
        )
    elif call_args or call_kwargs:
        raise ValueError(
            "Example arguments (args=, kwargs=) go with a function; the graph form takes ys= "
            f"and xs= only. Received args={call_args!r}, kwargs={call_kwargs!r}")
    ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
    xs = list(xs) if isinstance(xs, (list, tuple)) else [xs]
    view = ForwardGraph(ys, xs)
    if not view.ops:
        raise ValueError("None of xs is connected to ys: there is nothing to analyze.")
    plan = choose(view, checkpoints)
    model = MemoryModel(view)
    predicted, recomputed = model.predict(model.positions_of(plan.tensors))
    plain, _ = model.predict([])
    curve = budget_curve(view, points=budget_points, model=model) if budget_points else []
    return Analysis(
        graph_ops=len(view.graph.get_operations()),
        forward_ops=len(view.ops),
        activation_ops=len(view.activation_ops),
        separators=[t.name for t in plan.separators],
        checkpoints=[t.name for t in plan.tensors],
        checkpoint_layers=[_layer_name(t) for t in plan.tensors],
        segments=plan.segments,
        activation_bytes=plan.activation_bytes,
        estimated_bytes=plan.estimated_bytes,
        forward_flops=float(sum(view.op_flops(op) for op in view.ops)),
        seconds=time.perf_counter() - start,
        plan=plan,
        predicted_bytes=predicted,
        plain_predicted_bytes=plain,
        recomputed_flops=recomputed,
        curve=curve,
    )
