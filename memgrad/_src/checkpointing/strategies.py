"""Checkpoint strategies: policy objects that choose what the rewrite keeps.

A strategy is a policy object with ``plan(view) -> CheckpointPlan`` and, optionally,
``refine(view, plan, grads)`` (the `Strategy` protocol); the rewrite recomputes everything
the plan does not keep, segment by segment. The strings ``'memory'``, ``'speed'`` and
``'collection'`` and a list of tensors are aliases for `Memory()`, `Speed()`,
`Collection()` and `Tensors(list)`, whose plans are made in
`memgrad._src.checkpointing.plans`.
"""

from memgrad._src.checkpointing.plans import (  # noqa: F401 - CheckpointPlan is re-exported
    COLLECTION,
    CheckpointPlan,
    collection_plan,
    list_plan,
    memory_plan,
    speed_plan,
)

MODES = ("memory", "speed", "collection")


class Strategy:
    """The protocol every checkpoint strategy follows: ``plan(view) -> CheckpointPlan``, and
    optionally ``refine(view, plan, grads)``.

    ``view`` is the read-only `memgrad.strategies.ForwardGraph` of the traced forward pass
    between ``xs`` and ``ys``: ``view.graph``, ``view.ops`` (forward ops in topological
    order), ``view.activation_ops`` (those carrying data from the inputs rather than
    parameters), ``view.is_forward(op)``, ``view.is_activation(tensor)``,
    ``view.activation_outputs(op)``, ``view.tensor_bytes(tensor)``, ``view.op_flops(op)`` and
    ``view.networkx()``. The plan names the tensors to keep; build it with
    ``Tensors(kept).plan(view)``, which checks them and fills in the estimates.
    `memgrad.gradients`, `memgrad.GradientTape`, `memgrad.enable_checkpointing` and
    `memgrad.analyze` accept any object with this method, so a user policy is a subclass (or
    any class) defining ``plan``; its ``name`` shows in `memgrad.record_rewrites` logs.

    A strategy that wants to see the rewrite of its plan before it is used defines
    ``refine``: memgrad calls it after building each rewrite, with the gradients it made (in
    the traced graph, not yet run), and rewrites again with the plan it returns until it
    returns None. `Budget` uses it to measure each candidate plan's peak and move on to the
    next while it is over the budget. Errors ``refine`` raises reach the caller. What
    ``plan`` hands to ``refine`` goes in the plan's ``strategy_state``.

    memgrad's own strategies declare ``built_in = True`` on their class; leave it False in
    yours (a subclass of a built-in strategy is yours too): your plans are then labelled with
    your ``name``, and what your strategy raises reaches the caller instead of a warned
    fallback to plain `tf.gradients`.

    Example:
      ```python
      class EveryMatMulOutput(memgrad.strategies.Strategy):
          name = "matmuls"

          def plan(self, view):
              kept = [op.outputs[0] for op in view.activation_ops if op.type == "MatMul"]
              return memgrad.strategies.Tensors(kept).plan(view)
      ```
    """

    name = "strategy"
    # memgrad's own strategies set this on their class. A plan of theirs keeps its mode and
    # an internal failure of theirs falls back to plain tf.gradients with a warning; a user
    # strategy's plan is labelled with its ``name`` and what it raises reaches the caller.
    # Read from the class itself (`is_built_in`): a user's subclass of `Memory` is the user's.
    built_in = False

    def plan(self, view):  # pragma: no cover - the protocol
        """Returns the `CheckpointPlan` for ``view`` (a `ForwardGraph`)."""
        raise NotImplementedError(f"{type(self).__name__} must define plan(view)")

    def refine(self, view, plan, grads):
        """After the rewrite of ``plan`` made ``grads``: a new plan to rewrite instead, or
        None to keep this one (the default).

        Args:
          view: the `ForwardGraph` planned for.
          plan: the `CheckpointPlan` just rewritten.
          grads: the gradients its rewrite made (tensors of ``view.graph``; None where a
            variable gets none).

        Returns:
          A `CheckpointPlan`, or None.
        """
        del view, plan, grads
        return None

    def __repr__(self):
        return f"{type(self).__name__}()"


def is_built_in(strategy):
    """Whether ``strategy``'s own class declares ``built_in = True`` (memgrad's strategies)."""
    return vars(type(strategy)).get("built_in", False) is True


class Memory(Strategy):
    """Least memory: about sqrt(n) checkpoints on a chain of n, placed where the fewest
    bytes are alive.

    For each number of segments, the cuts start near equal shares of the activation bytes,
    each at the cheapest cut in its window (a single-tensor separator when there is one);
    the number whose estimate (kept bytes plus the largest segment) is least wins, and then
    each cut moves between its neighbours to where that estimate is least. A search over
    every set of cut positions (dynamic programming, within 1% of the least) then replaces
    those cuts where its estimate is lower, a segment counting only the tensors its
    gradients read, which is what a recomputed segment holds (`memory_plan`).

    Caveats: stateful ops (random ops without a seed) are never re-run: their outputs are
    kept. Under XLA (``jit_compile=True``) the saving holds: recomputation is gated on its
    gradient by a data dependency.

    Example:
      ```python
      grads = memgrad.gradients(loss, variables, checkpoints=memgrad.strategies.Memory())
      ```
    """

    built_in = True

    name = "memory"

    def plan(self, view):
        """Returns the plan (see `memory_plan`)."""
        return memory_plan(view)


class Speed(Strategy):
    """Least recomputation: keep the inputs and outputs of expensive ops (matmuls, convs).

    Example:
      ```python
      grads = memgrad.gradients(loss, variables, checkpoints=memgrad.strategies.Speed())
      ```
    """

    built_in = True

    name = "speed"

    def plan(self, view):
        """Returns the plan (see `speed_plan`)."""
        return speed_plan(view)


class Collection(Strategy):
    """Keep the tensors marked with `memgrad.mark_checkpoint` or the `memgrad.layers.Checkpoint` layer.

    Args:
      collection: the graph collection holding the marks (default ``"checkpoints"``).

    Example:
      ```python
      h = memgrad.mark_checkpoint(tf.tanh(x @ w))
      grads = memgrad.gradients(loss, [w], checkpoints=memgrad.strategies.Collection())
      ```
    """

    built_in = True

    name = "collection"

    def __init__(self, collection=COLLECTION):
        self.collection = collection

    def plan(self, view):
        """Returns the plan of the marked tensors found in ``view``."""
        return collection_plan(view, self.collection)

    def __repr__(self):
        return f"Collection({self.collection!r})"


class Tensors(Strategy):
    """Keep exactly these graph tensors (each must be computed from xs and needed by ys).

    Args:
      tensors: a list of symbolic tensors of the traced graph.

    Example:
      ```python
      grads = memgrad.gradients(loss, variables, checkpoints=memgrad.strategies.Tensors([h1, h2]))
      ```
    """

    built_in = True

    name = "list"

    def __init__(self, tensors):
        self.tensors = list(tensors)

    def plan(self, view):
        """Returns the plan keeping ``tensors``."""
        return list_plan(view, self.tensors)

    def __repr__(self):
        return f"Tensors(<{len(self.tensors)} tensors>)"


ALIASES = {"memory": Memory, "speed": Speed, "collection": Collection}


def as_strategy(checkpoints):
    """The policy object for a ``checkpoints`` argument: a `Strategy`, a string alias or a list.

    Args:
      checkpoints: ``'memory'``, ``'speed'``, ``'collection'``, a list of tensors, or an
        object with a ``plan(view)`` method.

    Returns:
      An object with a ``plan(view)`` method.

    Raises:
      ValueError: for an unknown string.
      TypeError: for anything else.
    """
    if isinstance(checkpoints, str):
        if checkpoints in ALIASES:
            return ALIASES[checkpoints]()
        raise ValueError(
            f"checkpoints must be one of {MODES}, a list of tensors or a strategy such as "
            f"memgrad.strategies.Budget('1GiB'). Received: {checkpoints!r}"
        )
    if isinstance(checkpoints, (list, tuple)):
        return Tensors(checkpoints)
    if callable(getattr(checkpoints, "plan", None)):
        return checkpoints
    raise TypeError(
        f"checkpoints must be one of {MODES}, a list of tensors or a strategy such as "
        f"memgrad.strategies.Budget('1GiB'). Received: {type(checkpoints).__name__}"
    )


def choose(view, checkpoints):
    """The `CheckpointPlan` of ``checkpoints`` (any form `as_strategy` accepts) for ``view``.

    A user strategy's plan is labelled with the strategy's ``name`` (when it has one).
    """
    strategy = as_strategy(checkpoints)
    return checked_plan(strategy, strategy.plan(view), "plan(view)")


def checked_plan(strategy, plan, method, optional=False):
    """``plan``, as ``strategy.<method>`` returned it, once it is a `CheckpointPlan` (or None,
    where ``optional``), labelled with a user strategy's ``name`` (when it has one)."""
    if plan is None and optional:
        return None
    if not isinstance(plan, CheckpointPlan):
        expected = "a memgrad.strategies.CheckpointPlan" + (" or None" if optional else "")
        raise TypeError(
            f"{type(strategy).__name__}.{method} must return {expected} "
            f"(e.g. Tensors(kept).plan(view)). Received: {type(plan).__name__}")
    name = getattr(strategy, "name", None)
    if isinstance(name, str) and not is_built_in(strategy):
        plan.mode = name
    return plan
