"""`Budget`: a checkpoint strategy that fits the step's peak in a byte budget, deterministically.

Its `plan` simulates plain backprop's peak with Grappler (nothing runs; the same graph gives
the same figure in every process) and picks a first candidate among the planner's plans
(`memgrad._src.checkpointing.budget_planner`); its `refine` simulates each candidate's
rewrite and walks on while the peak is over the target:
in the order of `walk_order`, rescaling the memory model by each simulated peak
(`next_candidate`), by bisection where the model is far off (`Budget._bisect`), with one
refinement of the model's own plan (`Budget._refined`). Every step of the walk reads
figures that depend on the graph alone, so its decision and plan do too.
"""

import time
import warnings

import tensorflow as tf

from memgrad._src import tf_internals
from memgrad._src.checkpointing.budget_measure import NOT_FOUND, peak_of, plain_gradients
from memgrad._src.checkpointing.budget_walk import BudgetWalk, next_candidate, walk_order
from memgrad._src.checkpointing.budget_planner import (
    BudgetError, CurvePoint, budget_error, Planner, budget_curve)
from memgrad._src.checkpointing.loops import LOOP_TYPES
from memgrad._src.checkpointing.plans import CheckpointPlan, absorb_bias
from memgrad._src.checkpointing.strategies import Strategy
from memgrad._src.graph.kernels import measuring_device
from memgrad._src.units import format_bytes, parse_bytes

__all__ = ["Budget", "BudgetError", "CurvePoint", "budget_curve"]

# The share of a budget held back by default, for what a simulated (or modelled) peak does
# not see: the executor's order of ops, which moves a step's peak by 5-10% from call to
# call, its running recomputations beside other backward ops, the allocator's rounding and
# chunk fitting (BFC hands out a free chunk under twice the request whole: a few percent,
# up to 23% over the bytes requested in one MobileNetV3Small call).
# Measured, the training step's peak over its plan's simulated peak (2-core CPU, oneDNN on):
# GPT-2 6x384 half-way 1.04-1.14 (121 MiB simulated), DenseNet121 1.03-1.10 (34 MiB).
# Over its modelled peak, one inter-op thread, five calls in each of several fresh
# processes: two-block GPT-2 at Budget(0.6) 1.00-1.13 (1.16-1.50 before the first copy
# waited for the last segment's weight gradients), MobileNetV3Small at Budget(0.8)
# (oneDNN) 1.07-1.29, DenseNet121 at Budget(0.8) 0.91-1.04. 20% holds all but the worst
# MobileNetV3Small call (1.29 x 0.8 = 1.03 of the budget), from the allocator's fitting:
# its bytes requested, 1.05-1.06x the model, are within it.
SIMULATED_MARGIN = 0.2
# Loops: the memory model (and Grappler's simulation) sees a loop as one op with its inputs
# and outputs; the per-step intermediates it accumulates for its gradient (TensorLists) do
# not show. A 2-layer Keras LSTM (128 steps, batch 16, 128 units): plain backprop modelled
# at 4.0 MiB (simulated 1.1), measured 31.4.
LOOP_NOTE = (
    "The step has {loops} loop(s) (While ops: Keras RNN layers, tf.scan, tf.map_fn, "
    "tf.while_loop): the memory model does not count the per-step intermediates a loop "
    "keeps for its gradient, so the plan and plain backprop's modelled peak undercount "
    "them and the measured peak can exceed the budget (a 2-layer LSTM over 128 steps: "
    "modelled 4.0 MiB, measured 31.4). Measure the step (memgrad.profiler.measure) and "
    "budget in bytes with that room, or use checkpoints='memory', which segments loops.")


class Budget(Strategy):
    """`checkpoints=Budget(limit)`: fit the step's peak in a byte budget, recomputing little.

    What counts is what the gradient computation allocates above what exists before it
    (weights, optimizer state, inputs): the activations kept for backprop, the gradients in
    flight and the weights' gradients, the figure
    `memgrad.profiler.measure(step).peak_above_baseline_bytes` reads for a step that computes
    gradients.

    Deterministic and cheap: the Budget plans on the memory model of the traced graph
    (`memgrad.graph.MemoryModel`), never on a run: which tensors each op's gradient reads
    (asked of TensorFlow's own gradient functions), their static sizes, the gradients in
    flight and the weights' gradients, position by position through the backward pass, and
    the scratch buffers of the convolutions' kernels (each distinct one run once alone on
    zeros, cached for the process). One dynamic program finds the plan recomputing the
    fewest FLOPs whose modelled peak fits the budget less the margin; the step is rewritten
    once. The same graph and budget give the same decision and the same plan in every call
    and every process. A fraction is of plain backprop's modelled peak. A step's measured
    peak moves by 5-10% from call to call with the executor's order of ops and the
    allocator's chunk fitting, and sits up to about 1.3x its plan's modelled peak; the
    margin (20%) is held back for that. ``simulate=True`` checks each candidate plan's
    rewrite on Grappler's simulation instead (closer on graphs the model reads poorly,
    several times the cost; ``plan.details['scale_source']``: 'simulated' or 'model').
    Loops (While ops) are not modelled inside: their per-step intermediates are not
    counted, the Budget warns and ``plan.details['loops']`` counts them (docs/budget.md).

    Every gradient is counted alive to the end of the backward pass (`hold_gradients`), as
    in a step that returns them, clips them by their global norm, or applies them after the
    function. A step that applies each inside the same `tf.function` (Keras's
    ``optimizer.apply`` and ``fit`` without global clipping, one ``assign_sub`` per
    variable) frees each soon after it is made and peaks lower, by up to the size of all
    gradients (DenseNet121's 'memory' plan: 24-28 MiB applied, 46-48 MiB returned):
    there ``hold_gradients=False`` accepts budgets the default refuses.

    Args:
      limit: bytes (an int, or a string such as `"96MiB"` or `"1.5GB"`), or a float in
        (0, 1]: a fraction of plain backprop's modelled (or simulated) peak. A budget at or
        above it keeps nothing and recomputes nothing (``plan.details['same_as_plain']``).
      margin: the share of the budget held back for what the predicted figure does not see
        (the executor's order of ops from call to call, what the step does besides the
        gradients): plans are accepted at a predicted peak of at most
        `(1 - margin) * limit`, and none above. None (default): 20%, measured: steps ran up
        to 1.29x their plan's predicted peak (see `SIMULATED_MARGIN`).
      measure: deprecated and ignored (a Budget no longer runs the step on zeros to measure
        plans: the measured figures moved with the executor's order, and with them the
        plan). True warns once.
      simulate: False (default): plan on the memory model alone (one rewrite, no
        simulation). True: trace plain backprop on the side and simulate it and each
        candidate plan's rewrite with Grappler, as `memgrad.profiler.predict_peak` does
        (several rewrites and simulations at trace time: 3-5x plain's first call). In a
        graph traced for XLA (``jit_compile=True``) the model alone plans either way:
        Grappler does not see XLA's buffers, and what a simulation traces would be
        compiled with the step.
      scratch: count kernels' scratch buffers: convolutions' in the model, convolutions'
        and XLA-compiled calls' in the simulations (each distinct one runs once alone on
        zeros, at trace time; results are cached for the process).
      hold_gradients: True (default, also for None): every gradient counted alive to the
        end of the backward pass, as a step that applies them together holds them. False:
        each gradient consumed as soon as it is made; on a step that holds them, the peak
        can then exceed the budget by up to the gradients' size.

    Simulating (``simulate=True``), it chooses among the memory model's cheapest plan for
    the target (scaled to the simulated plain peak) and plans that are the same for every
    budget on a graph
    (`Planner.candidate_plans`: the model's cheapest plans for 90%, 80%, ..., 10% of its
    plain peak, its leanest plan, the 'memory' strategy's, and prefixes of it: its first k
    cuts, recomputing the forward pass only up to the last). It builds their rewrites
    from the least recomputation up, simulates each, and keeps the first whose peak is
    within the target; the rewrites not kept are never run by the step. It starts at the
    cheapest candidate the scaled memory model puts within 25% of the target and tries the
    cheaper ones last (`walk_order`). A candidate simulated over the target rescales the
    model by its simulated/modelled ratio: those the rescaled model still puts over are
    tried last (`next_candidate`). Where the model puts every candidate further over, it
    bisects them by simulated peak (`_bisect`). When none fits, a BudgetError names the
    least peak among those simulated, plus the margin.

    The plan it returns carries its figures in ``plan.details``: `budget_bytes`,
    `target_bytes` (the budget less the margin), `predicted_bytes` (the plan's modelled
    peak, or its rewrite's simulated peak when simulating), `simulated_bytes`, `plain_bytes`
    (simulated or modelled: `scale_source`), `modelled_plain_bytes`, `scale` (plain peak
    over modelled plain peak), `candidate` (its index among `candidates`, None for plain
    backprop or a model-only plan), `tried_bytes` (the peaks of those tried before it,
    plain backprop's first), `recomputed_flops`, `forward_flops`, `checkpoints`,
    `seconds`; read them from `memgrad.analyze` or the
    `memgrad.record_rewrites()` log.

    Raises:
      TypeError: for a limit that is neither a number nor a string, a margin that is not a
        number, a measure, simulate or scratch that is not a bool, or a hold_gradients that
        is none of True, False, None.
      ValueError: for a limit that is not a positive byte size nor a fraction in (0, 1],
        or a margin outside [0, 1).
      BudgetError: (when planning) if no plan fits; it states the smallest budget that does,
        in bytes, or as a fraction when the limit was one (the least modelled peak of any
        plan, or simulated peak of the candidates, with the margin). Planning is
        deterministic, so that budget is accepted when used.

    Example:
      ```python
      budget = memgrad.strategies.Budget("64MiB")
      grads = memgrad.gradients(loss, variables, checkpoints=budget)
      with memgrad.GradientTape(checkpoints=memgrad.strategies.Budget(0.25)) as tape: ...
      ```
    """

    built_in = True

    name = "budget"

    def __init__(self, limit, margin=None, measure=False, simulate=False, scratch=True,
                 hold_gradients=None):
        if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
            raise TypeError(f"Budget margin must be a number in [0, 1) or None. Received: "
                            f"{type(margin).__name__} {margin!r}")
        if margin is not None and not 0.0 <= margin < 1.0:
            raise ValueError(f"Budget margin must lie in [0, 1). Received: {margin!r}")
        for name, value in (("measure", measure), ("simulate", simulate), ("scratch", scratch)):
            if not isinstance(value, bool):
                raise TypeError(f"Budget {name} must be True or False. Received: {value!r}")
        if hold_gradients is not None and not isinstance(hold_gradients, bool):
            raise TypeError(f"Budget hold_gradients must be True, False or None. Received: "
                            f"{hold_gradients!r}")
        if measure:
            warnings.warn(
                "Budget(measure=True) is deprecated and ignored: a Budget plans on Grappler's "
                "simulation of the graph, which gives the same plan in every process (measured "
                "plan-time runs moved with the executor's order of ops).",
                DeprecationWarning, stacklevel=2)
        self.scratch = scratch
        self.hold_gradients = True if hold_gradients is None else hold_gradients
        self.margin = None if margin is None else float(margin)
        self.simulate = simulate
        if isinstance(limit, bool) or not isinstance(limit, (int, float, str)):
            raise TypeError(
                "Budget expects bytes (an int or a string such as '64MiB') or a fraction "
                f"in (0, 1]. Received: {type(limit).__name__} {limit!r}"
            )
        if isinstance(limit, float):
            if not 0.0 < limit <= 1.0:
                raise ValueError(
                    "A fractional Budget must lie in (0, 1] (a share of plain backprop's "
                    f"peak). Received: {limit!r}"
                )
            self.fraction, self.bytes = limit, None
        else:
            value = parse_bytes(limit)
            if value <= 0:
                raise ValueError(f"Budget bytes must be positive. Received: {limit!r}")
            self.fraction, self.bytes = None, int(value)

    def __repr__(self):
        if self.fraction is not None:
            return f"Budget({self.fraction!r})"
        return f"Budget({format_bytes(self.bytes)!r})"

    @property
    def refines(self):
        """Whether `refine` may replace a plan once its rewrite exists (simulating: the
        rewrite's own peak decides)."""
        return self.simulate

    def resolve(self, plain_bytes):
        """The budget in bytes, given plain backprop's peak."""
        return self.fraction * plain_bytes if self.fraction is not None else float(self.bytes)

    def _margin(self, source):
        return SIMULATED_MARGIN if self.margin is None else self.margin

    @tf.autograph.experimental.do_not_convert
    def plan(self, view):
        """The first `CheckpointPlan` for one traced graph (called by `memgrad.gradients`).

        Simulating, it is plain backprop when plain's peak fits the budget, else the
        cheapest candidate plan; `refine` moves on to the next candidate while the
        rewrite's simulated peak is over the target.
        """
        start = time.perf_counter()
        loops = sum(op.type in LOOP_TYPES for op in view.region)
        if loops:
            warnings.warn(f"{self!r}: {LOOP_NOTE.format(loops=loops)}", stacklevel=2)
        try:
            return self._plan(view, start, loops)
        except BudgetError as error:
            if loops:
                error.args = (f"{error.args[0]} {LOOP_NOTE.format(loops=loops)}",)
            raise

    def _plan(self, view, start, loops):
        device = measuring_device() if self.scratch else None  # where kernels' scratch is read
        planner = Planner(view, hold_gradients=self.hold_gradients, kernels=device)
        modelled = planner.plain_bytes
        # Under XLA the model alone plans: Grappler simulates TensorFlow's executor, not
        # XLA's buffers, and the side gradient and candidate rewrites a simulation builds
        # stay in the traced graph, where XLA would compile them too.
        simulating = self.refines and not tf_internals.graph_or_parents_in_xla_context(
            view.graph)
        kernels = device if simulating else None
        grads = plain_gradients(view) if simulating else None
        plain, source = peak_of(view, grads, kernels, self.hold_gradients) if grads else NOT_FOUND
        scale = plain / modelled if plain and modelled > 0 else 1.0
        plain_bytes = plain if plain else modelled
        budget = self.resolve(plain_bytes)
        margin = self._margin(source)
        target = budget * (1.0 - margin)
        walk = BudgetWalk(planner=planner, scale=scale, plain_bytes=plain_bytes, budget_bytes=budget,
                          target_bytes=target, start=start, source=source, margin=margin,
                          kernels=kernels, hold=self.hold_gradients, loops=loops)
        if source != "model":
            if budget >= plain:
                return self._plan_for(view, walk, [], modelled, 0.0, index=None)
            candidates = tuple(planner.candidate_plans(target / scale))
            walk = walk.replace(  # plain backprop was tried: over the budget
                tried=(plain,), candidates=candidates,
                own=(target / scale, planner.cheapest(target / scale) if target < plain else None))
            if not candidates:
                raise self._no_plan(walk)
            order = walk_order(candidates, scale, target)
            if order is None:  # the model puts every candidate too far over: bisect
                walk = walk.replace(search=(0, len(candidates)))
                first = (len(candidates) - 1) // 2
            else:
                walk = walk.replace(order=order)
                first = order[0]
            return self._candidate_plan(view, walk, first)
        if budget >= plain_bytes:  # plain backprop fits: keep nothing
            return self._plan_for(view, walk, [], modelled, 0.0, index=None)
        try:
            cuts, peak, cost = planner.plan(target / scale)
        except BudgetError as error:
            raise budget_error(
                budget, error.smallest_feasible_bytes * scale / (1.0 - margin),
                plain_bytes, margin=margin, fraction=self.fraction, source=source,
            ) from None
        return self._plan_for(view, walk, cuts, peak, cost, index=None)

    def _plan_for(self, view, walk, cuts, peak, cost, index):
        m = walk.planner.model
        tensors = absorb_bias(view, m.tensors_for(cuts))
        details = dict(
            budget_bytes=walk.budget_bytes, target_bytes=walk.target_bytes,
            predicted_bytes=peak * walk.scale, simulated_bytes=None,
            plain_bytes=walk.plain_bytes, modelled_plain_bytes=walk.planner.plain_bytes,
            scale=walk.scale, scale_source=walk.source, margin=walk.margin, candidate=index,
            candidates=None if index is None else len(walk.candidates),
            tried_bytes=list(walk.tried), recomputed_flops=cost,
            forward_flops=float(m.flops.sum()), checkpoints=len(tensors), loops=walk.loops,
            seconds=time.perf_counter() - walk.start,
        )
        if not cuts:  # plain backprop fits the budget: the answer, not a failure to plan
            details["same_as_plain"] = True
        return CheckpointPlan(
            mode="budget", tensors=tensors, segments=len(cuts) + 1,
            activation_bytes=walk.planner.plain_bytes, estimated_bytes=peak, details=details,
            strategy_state=walk if index is not None else None,
        )

    def _no_plan(self, walk):
        least = min([*walk.tried, *(peak for _, peak in walk.peaks)])
        return budget_error(walk.budget_bytes, least / (1.0 - walk.margin),
                             walk.plain_bytes, margin=walk.margin, fraction=self.fraction,
                             source=walk.source)

    @tf.autograph.experimental.do_not_convert
    def refine(self, view, plan, grads):
        """After the rewrite of ``plan`` made ``grads`` (the `Strategy` hook, called by
        `memgrad.gradients`): its simulated peak goes
        into ``plan.details`` (``simulated_bytes``, and
        ``predicted_bytes``); returns the next candidate plan when that peak is over the
        target, else None (keep this one).

        Args:
          view: the `ForwardGraph` planned for.
          plan: the plan just rewritten.
          grads: the gradients the rewrite made.

        Raises:
          BudgetError: when every candidate's peak is over the target; it names the least of
            them (plus the margin), which is a budget that plan fits.
        """
        walk = plan.strategy_state
        if walk is None:  # plain backprop, or a plan made on the memory model alone
            return None
        details = plan.details
        if walk.chosen is not None:  # a plan rebuilt: its peak was found already
            details["predicted_bytes"] = walk.peak_by_candidate[walk.chosen]
            details[f"{walk.source}_bytes"] = details["predicted_bytes"]
            return None
        found = peak_of(view, grads, walk.kernels, walk.hold)
        if found.bytes:
            details[f"{found.source}_bytes"] = details["predicted_bytes"] = found.bytes
        peak = details["predicted_bytes"]
        walk = walk.with_peak(details["candidate"], peak)
        if walk.search is not None:
            return self._bisect(view, walk, plan, peak <= details["target_bytes"])
        if peak <= details["target_bytes"]:
            return None
        refined, walk = self._refined(view, walk, plan, peak)
        if refined is not None:
            return refined
        index, walk = next_candidate(walk, details["candidate"], peak)
        if index is None:
            raise self._no_plan(walk)
        return self._candidate_plan(view, walk, index)

    def _candidate_plan(self, view, walk, index):
        cost, model_peak, cuts = walk.candidates[index]
        return self._plan_for(view, walk, cuts, model_peak, cost, index=index)

    def _refined(self, view, walk, plan, peak):
        """Once per walk, when the model's own plan for the target simulated ``peak`` over it:
        the model's cheapest plan for a target lowered by that overshoot, as a new candidate
        tried next (it recomputes less than the fixed candidates after it, which jump in
        steps of 10% of plain's peak). ``(that plan or None, the walk)``: None when there is
        none, or it is a candidate already."""
        own_budget, own_cuts = walk.own
        current = walk.candidates[plan.details["candidate"]][2]
        if walk.refined or not own_cuts or current != own_cuts:
            return None, walk
        walk = walk.replace(refined=True)
        cuts = walk.planner.solve(own_budget * walk.target_bytes / peak * 0.99)
        if not cuts or any(list(cuts) == option[2] for option in walk.candidates):
            return None, walk
        model_peak, cost = walk.planner.model.predict(cuts)
        index = len(walk.candidates)
        after = walk.order.index(plan.details["candidate"]) + 1
        walk = walk.replace(candidates=walk.candidates + ((cost, model_peak, cuts),),
                            order=walk.order[:after] + (index,) + walk.order[after:])
        return self._plan_for(view, walk, cuts, model_peak, cost, index=index), walk

    def _bisect(self, view, walk, plan, fits):
        """The next step of a bisection for the cheapest candidate that fits (candidates in
        order of recomputation, their peaks taken to fall as it grows): the next candidate's
        plan, None to keep ``plan``, or the one found to fit to rebuild (a BudgetError when none
        does)."""
        index = plan.details["candidate"]
        lo, hi = walk.search
        lo, hi = (lo, index) if fits else (index + 1, hi)
        walk = walk.replace(search=(lo, hi))
        if lo < hi:
            index = (lo + hi) // 2
        elif hi == len(walk.candidates):
            raise self._no_plan(walk)
        elif hi == plan.details["candidate"]:
            return None
        else:
            index, walk = hi, walk.replace(chosen=hi)
        return self._candidate_plan(view, walk, index)
