"""Checkpoint plans: which forward tensors to keep for the backward pass, as the built-in
strategies choose them (`memgrad._src.checkpointing.strategies` holds the strategy objects).

- `memory_plan`: separators spaced by bytes. For each number of segments k it places k - 1
  cuts near equal shares of the activation bytes, each at the cheapest cut in its window
  (a single-tensor separator when there is one, else the smallest set of live tensors), and
  keeps the k whose estimated peak (kept bytes plus the largest segment) is least; then
  each cut moves between its neighbours to where that estimate is least (`improve_cuts`).
  Then the least such peak when a segment counts only the bytes its gradients read
  (`least_cuts.least_cuts`, within 1% of the least any cut positions reach) replaces
  those cuts where it is at least 0.5% lower. On a uniform chain of n layers that is
  about sqrt(n) checkpoints.
- `speed_plan`: the inputs and outputs of expensive ops (matrix products, convolutions,
  einsum), so only cheap ops are recomputed.
- `collection_plan`: the tensors marked with `memgrad.mark_checkpoint(t)` or the `Checkpoint`
  layer.
- `list_plan`: the tensors given (a checkpoint that only feeds a bias addition is moved past
  it, see `absorb_bias`).
"""

import dataclasses
import math

import numpy as np
import tensorflow as tf

from memgrad._src.checkpointing.least_cuts import least_cuts, plan_estimate, read_profile
from memgrad._src.graph.memory_model import tensors_read
from memgrad._src.graph.separators import cut_profile, single_tensor_separators
from memgrad._src.graph.view import EXPENSIVE_TYPES

COLLECTION = "checkpoints"
# 'speed' runs plain backprop when its plan would free less than this share of what plain
# backprop keeps for the backward pass.
SPEED_MIN_SAVING = 0.05
# 'speed' recomputes the cheap ops after an expensive op from its output only where what
# plain backprop keeps in them is more than this many times that output: the least gain that
# pays for re-running them. A biased convolution before BatchNormalization keeps the bias's
# output, the convolution's size: trading one for the other re-ran the batch statistics for
# nothing (ResNet50: 1.14x plain's time for 0.88x of its peak, from small tensors alone).
SPEED_REGION_MIN_RATIO = 1.5
# At most this many cheap ops are re-run to recompute a region's end (`_drop_region_ends`):
# an exact GELU is 8, a tanh one 10.
REGION_END_OPS = 32
# Passes of `improve_cuts` over the 'memory' plan's cuts (each moves every cut at most once),
# and the least share of the estimate a move must save. Positions a sliver apart under the
# model are a tie in practice: ResNet50's cut moved from a block's ReLU to the sum before it
# (0.1% less, modelled) and measured 3% more, the ReLU then re-run beside its checkpoint.
IMPROVE_SWEEPS = 4
IMPROVE_MIN_GAIN = 0.005


@dataclasses.dataclass
class CheckpointPlan:
    """What a strategy chose, with the estimates that led to it.

    Attributes:
      mode: the strategy's name (`'memory'`, `'speed'`, `'collection'` or `'list'`).
      tensors: the checkpoints, in forward order.
      separators: single-tensor separators found (filled by `'memory'`).
      segments: the number of segments the checkpoints cut the forward into.
      activation_bytes: estimated bytes of all activations (what plain backprop may keep).
      estimated_bytes: estimated activation peak with this plan (kept checkpoints plus the
        largest recomputed segment).
      details: strategy-specific figures (a `Budget` records its budget, target, predicted
        and plain peaks, recomputed FLOPs and planning time here). ``same_as_plain=True``
        says an empty plan is meant (plain backprop is the strategy's answer): memgrad then
        runs plain ``tf.gradients`` without warning that nothing was worth keeping.
      loops: how the forward pass's loops (``tf.while_loop``, ``tf.scan``, Keras RNN
        layers) are differentiated: ``'segments'`` (the forward keeps every k-th step's
        state, k about sqrt(steps), and the backward replays a segment of steps at a time)
        or ``'kept'`` (TensorFlow's own loop gradient: every step's intermediates are kept).
      strategy_state: what the strategy hands from its ``plan`` to its ``refine`` (a
        `Budget`'s walk through its candidate plans), or None; memgrad passes it on
        untouched. Keep it immutable: a refined plan gets a new state.
    """

    mode: str
    tensors: list
    separators: list = dataclasses.field(default_factory=list)
    segments: int = 1
    activation_bytes: float = 0.0
    estimated_bytes: float = 0.0
    details: dict = dataclasses.field(default_factory=dict)
    loops: str = "segments"
    strategy_state: object = None


# Ops that add a parameter to their input: a checkpoint is moved past them (see _absorb).
_BIAS_TYPES = frozenset({"BiasAdd", "Add", "AddV2"})


def absorb_bias(view, tensors):
    """Move each checkpoint that only feeds a bias addition to that addition's output.

    Keeping `conv(x)` and recomputing `conv(x) + b` from it costs the same memory as
    keeping `conv(x) + b`, and a checkpoint between a convolution and its bias would put
    their gradients in two segments. oneDNN's graph pass fuses those two gradients
    (Conv2DBackpropFilter with BiasAddGrad) into one node regardless, which then depends
    on itself through the segment gate: a cycle. So checkpoints never split that pair.
    """
    moved = {}
    for t in tensors:
        while True:
            consumers = [c for c in t.consumers() if view.is_forward(c)]
            if len(consumers) != 1 or consumers[0].type not in _BIAS_TYPES:
                break
            op = consumers[0]
            others = [i for i in op.inputs if i.ref() != t.ref()]
            if len(others) != 1 or view.is_activation(others[0]):
                break
            t = op.outputs[0]
        moved.setdefault(t.ref(), t)
    return list(moved.values())


def cuts_for(profile, segments):
    produced, live = profile.produced, profile.live
    n = len(produced)
    total = float(produced[-1])
    half = total / (2 * segments)
    cuts = []
    for j in range(1, segments):
        target = total * j / segments
        lo = int(np.searchsorted(produced, target - half, side="left"))
        hi = int(np.searchsorted(produced, target + half, side="right"))
        lo, hi = max(lo, 0), min(hi, n - 1)
        if hi <= lo:
            continue
        window = live[lo:hi]
        best = window.min()
        candidates = np.flatnonzero(window <= best * 1.0001) + lo
        pick = candidates[np.argmin(np.abs(produced[candidates] - target))]
        cuts.append(int(pick))
    return sorted(set(cuts))


def memory_cuts(profile):
    """The 'memory' strategy's cut positions on a `cut_profile`: cuts near equal shares of
    the bytes, with the number of segments that minimises the estimate, then moved by
    `improve_cuts`.

    Returns:
      `(estimate, cuts)`; `cuts` is empty when no plan beats keeping everything.
    """
    n = len(profile.ops)
    total = float(profile.produced[-1]) if n else 0.0
    best = (total, [])
    if n >= 3 and total > 0:
        max_segments = min(n, 2 * int(math.isqrt(n)) + 3)
        for segments in range(2, max_segments + 1):
            cuts = cuts_for(profile, segments)
            if not cuts:
                continue
            estimate, _ = plan_estimate(profile, cuts)
            if estimate < best[0] * 0.999:
                best = (estimate, cuts)
    if best[1]:
        cuts = improve_cuts(profile, best[1])
        estimate, _ = plan_estimate(profile, cuts)
        if estimate < best[0]:
            best = (estimate, cuts)
    return best


def improve_cuts(profile, cuts, sweeps=IMPROVE_SWEEPS):
    """Moves each cut, one at a time, to the position between its neighbours where the
    estimate (kept bytes plus the largest segment) is least, until no move lowers it by
    `IMPROVE_MIN_GAIN` (0.5%) of the estimate.

    A cut placed near an equal share of the bytes may sit where a wide tensor is alive (a
    transformer's MLP expansion, 4x the residual stream) while a narrow cut lies just outside
    its window. Moving cut j between its neighbours a < j < b changes only the tensors that
    cross it and neither neighbour (born after a, dead by b) and the two segments beside it;
    every other kept tensor and segment stays. So each sweep is linear in the tensors and
    positions, and the estimate never rises.

    Args:
      profile: a `CutProfile`.
      cuts: sorted cut positions (`cuts_for`'s).
      sweeps: at most this many passes over the cuts.

    Returns:
      Sorted cut positions whose estimate is at most that of ``cuts``.
    """
    n = len(profile.ops)
    cuts = sorted(cuts)
    births, deaths, sizes, produced = profile.births, profile.deaths, profile.sizes, profile.produced
    total = float(produced[-1])
    for _ in range(sweeps):
        moved = False
        least_gain = IMPROVE_MIN_GAIN * plan_estimate(profile, cuts)[0]
        for j in range(len(cuts)):
            lo = cuts[j - 1] if j > 0 else -1
            hi = cuts[j + 1] if j + 1 < len(cuts) else n
            if min(hi, n - 1) - lo < 2:  # no other position (a last cut stays before the last op)
                continue
            start = float(produced[lo]) if lo >= 0 else 0.0
            end = float(produced[hi]) if hi < n else total
            bounds = [0.0] + [float(produced[c]) for c in cuts] + [total]
            segments = np.diff(bounds)  # segment i lies between bounds i and i + 1
            rest = float(max(np.delete(segments, [j, j + 1]), default=0.0))
            # Bytes kept by a cut at p and by no neighbour: tensors born after lo, dead by hi.
            inside = (births > lo) & (deaths <= hi) & (births < hi)
            delta = np.zeros(hi - lo + 1)
            np.add.at(delta, births[inside] - lo, sizes[inside])
            np.add.at(delta, deaths[inside] - lo, -sizes[inside])
            last = min(hi, n - 1)  # positions lo+1 .. last-1
            alone = np.cumsum(delta)[1:last - lo]
            positions = np.arange(lo + 1, last)
            segment = np.maximum(produced[positions] - start, end - produced[positions])
            cost = alone + np.maximum(segment, rest)
            best = int(positions[int(np.argmin(cost))])
            current = cost[cuts[j] - lo - 1]
            if best != cuts[j] and cost[best - lo - 1] < current - least_gain:
                cuts[j] = best
                moved = True
        if not moved:
            break
    return cuts


def memory_plan(view):
    """The 'memory' plan: cuts near equal shares of the bytes (`cuts_for`), with the number
    of segments that minimises the estimate, each then moved between its neighbours to where
    the estimate is least (`improve_cuts`); replaced by the least estimate when a segment
    counts only the bytes its gradients read (`least_cuts`), where that is at least
    `IMPROVE_MIN_GAIN` lower. The plan's ``estimated_bytes`` counts every byte a segment makes
    (`cut_profile`), as for the other strategies.

    Args:
      view: a `memgrad._src.graph.ForwardGraph`.

    Returns:
      A `CheckpointPlan`; its `tensors` are empty when no plan beats keeping everything.
    """
    separators = single_tensor_separators(view)
    profile = cut_profile(view)
    n = len(profile.ops)
    total = float(profile.produced[-1]) if n else 0.0
    estimate, cuts = memory_cuts(profile)
    if cuts:
        # The least peak when a segment counts only what its gradients read (`least_cuts`),
        # where that beats the spaced cuts by more than a move must save.
        read = read_profile(view, profile)
        spaced, _ = plan_estimate(read, cuts)
        least, least_at = least_cuts(read, upper=spaced)
        if least_at and least < spaced * (1 - IMPROVE_MIN_GAIN):
            cuts = least_at
            estimate, _ = plan_estimate(profile, cuts)
    chosen = {}
    for c in cuts:
        for t in profile.cut(c):
            chosen.setdefault(t.ref(), t)
    order = {op: i for i, op in enumerate(profile.ops)}
    tensors = absorb_bias(view, list(chosen.values()))
    tensors.sort(key=lambda t: (order.get(t.op, -1), t.value_index))
    return CheckpointPlan(
        mode="memory", tensors=tensors, separators=separators, segments=len(cuts) + 1,
        activation_bytes=total, estimated_bytes=estimate,
    )


def _plan_from_tensors(view, mode, tensors, absorb=True):
    if absorb:
        tensors = absorb_bias(view, tensors)
    profile = cut_profile(view)
    total = float(profile.produced[-1]) if len(profile.ops) else 0.0
    position = {op: i for i, op in enumerate(profile.ops)}
    cuts = sorted({position[t.op] for t in tensors if t.op in position})
    estimate, _ = plan_estimate(profile, cuts)
    return CheckpointPlan(
        mode=mode, tensors=list(tensors), segments=len(cuts) + 1, activation_bytes=total,
        estimated_bytes=estimate,
    )


def speed_plan(view):
    """Keep what no expensive op (MatMul, BatchMatMul, Conv*, Einsum) has to run again for,
    and never more than plain backprop keeps.

    The inputs of expensive ops that their gradients read are kept (plain backprop keeps
    them too), so every expensive op's gradient runs on the original op. An expensive op's
    output is kept only when it is itself read by a gradient, or when it is smaller than the
    tensors plain backprop would keep in the cheap ops it feeds (its "cheap region": bias,
    normalisation, activations, residual sums, up to the next expensive op): then the region
    is recomputed from it, provided the region keeps at least `SPEED_REGION_MIN_RATIO` (1.5)
    times the output's bytes (a bias before BatchNormalization keeps the product's size: no
    gain). Otherwise the region's saved tensors are kept as plain backprop keeps them, and
    nothing is recomputed there. A bias and ReLU after a matrix product keep
    nothing new (ReLU's output is the next product's input); a GELU's intermediates are
    recomputed from the product's output, and so is the GELU's output, the next product's
    input (`_drop_region_ends`: its ops are re-run for the GELU's gradient anyway). When the
    plan would free less than `SPEED_MIN_SAVING` (5%) of what plain backprop keeps, it is
    empty and plain `tf.gradients` runs (no rewrite, no warning): the rewrite's bookkeeping
    would cost about what it saves.
    """
    saved = _gradient_read(view)
    chosen = {}
    sources = set()  # expensive ops' outputs kept so that their cheap regions are recomputed
    expensive = [op for op in view.activation_ops if op.type in EXPENSIVE_TYPES]
    for op in expensive:
        for t in op.inputs:
            if view.is_activation(t) and t.dtype.is_floating and t.ref() in saved:
                chosen.setdefault(t.ref(), t)
    for op in expensive:
        for t in view.activation_outputs(op):
            if t.ref() in chosen:
                continue
            if t.ref() in saved:
                chosen[t.ref()] = t
                continue
            region = _cheap_region_saved(view, t, saved, chosen)
            region_bytes = sum(view.tensor_bytes(r) for r in region)
            if region_bytes > SPEED_REGION_MIN_RATIO * view.tensor_bytes(t):
                chosen[t.ref()] = t
                sources.add(t.ref())
            else:
                for r in region:
                    chosen.setdefault(r.ref(), r)
    _drop_region_ends(view, chosen, sources)
    _keep_shared_recomputation(view, chosen, saved)
    plan_tensors = list(chosen.values())
    saved_bytes = sum(view.tensor_bytes(ref.deref()) for ref in saved)
    freed = sum(view.tensor_bytes(ref.deref()) for ref in saved if ref not in chosen)
    added = sum(view.tensor_bytes(t) for ref, t in chosen.items() if ref not in saved)
    if freed - added < SPEED_MIN_SAVING * saved_bytes:
        # Nearly everything plain backprop keeps would be kept: the rewrite's own
        # bookkeeping would cost about what it saves.
        plan_tensors = []
    # No bias absorption here: with its inputs kept, an expensive op is not copied, so its
    # gradient and its bias's cannot be split across gated segments (see absorb_bias).
    plan = _plan_from_tensors(view, "speed", plan_tensors, absorb=False)
    plan.loops = "kept"  # a loop's steps are not recomputed either
    if not plan_tensors:
        plan.details["same_as_plain"] = True
    return plan


def _drop_region_ends(view, chosen, sources):
    """Removes from ``chosen`` the tensors a recomputed cheap region computes from kept
    tensors alone: the next expensive op's input at the end of a GELU whose intermediates are
    recomputed from the product before it. The region is re-run for its own gradients anyway;
    keeping its end saves only its last op (a GELU's final product) and costs the tensor's
    bytes (GPT-2's feed-forward: 4x the model width per token, per layer).

    A tensor goes only when the ops back to the kept tensors are cheap (no expensive op),
    recomputable, at most `REGION_END_OPS`, and each reads the region: the kept tensors met
    are ``sources`` (expensive ops' outputs kept for their regions, never removed), any other
    input a weight or a constant. A residual sum or a layer norm's output, which reads a
    tensor kept for other reasons, stays: removing it would chain one recomputation onto
    the next.
    """
    def give_up(op, seen):
        # An expensive op, a kept tensor not kept for its region, or a long walk: the walk
        # cannot end in a removal, so it stops there.
        return (op.type in EXPENSIVE_TYPES or len(seen) >= REGION_END_OPS
                or any(i.ref() in chosen and i.ref() not in sources for i in op.inputs))

    for ref, t in list(chosen.items()):
        if ref in sources or not view.walkable(t.op):
            continue
        walked = view.walk_back([t.op], chosen, give_up)
        if walked is None or not walked[1]:
            continue
        ops, met = walked
        # Every op re-run reads the region (a source or an op re-run before it); other
        # inputs are weights and constants.
        inside = [[i.ref() in met or i.op in ops for i in op.inputs] for op in ops]
        if all(any(flags) and all(f or not view.is_activation(i) for f, i in zip(flags, op.inputs))
               for flags, op in zip(inside, ops)):
            del chosen[ref]


def _keep_shared_recomputation(view, chosen, saved):
    """Adds to ``chosen`` the saved tensors that more than one kept tensor would recompute.

    Each kept tensor's segment recomputes the ops back to the kept tensors before it. Where
    cheap ops chain (a DenseNet block concatenates every layer's output onto the last
    concatenation), every later segment would recompute the whole chain again: quadratic work
    in the block's depth. An op that two segments would recompute keeps its output instead
    when plain backprop keeps it too (so the plan never keeps more than plain backprop).
    """
    xs = {t.ref() for t in view.x_tensors}
    while True:
        stop, visits = set(chosen) | xs, {}
        for t in chosen.values():
            if not view.recomputable(t.op):
                continue
            seen, _ = view.walk_back([t.op], stop)
            for op in seen - {t.op}:
                visits[op] = visits.get(op, 0) + 1
        shared = [out for op, count in visits.items() if count > 1 for out in op.outputs
                  if out.ref() in saved and out.ref() not in chosen]
        if not shared:
            return
        for t in shared:
            chosen[t.ref()] = t


def _gradient_read(view):
    """Refs of the activation tensors some forward op's gradient reads (what plain backprop
    keeps for the backward pass)."""
    read = set()
    for op in view.activation_ops:
        ins, outs = tensors_read(view, op)
        read.update(t.ref() for t in ins if view.is_activation(t))
        read.update(t.ref() for t in outs)
    return read


def _cheap_region_saved(view, tensor, saved, kept):
    """The tensors gradients read among those computed from ``tensor`` by cheap forward ops
    (up to expensive ops and kept tensors), not already kept."""
    found, seen, stack = {}, set(), [tensor]
    while stack:
        t = stack.pop()
        for consumer in t.consumers():
            if (consumer in seen or consumer.type in EXPENSIVE_TYPES
                    or not view.is_activation_op(consumer)):
                continue
            seen.add(consumer)
            for out in consumer.outputs:
                if out.ref() in kept or view.is_interior(out) or not out.dtype.is_floating:
                    continue
                if out.ref() in saved:
                    found.setdefault(out.ref(), out)
                stack.append(out)
    return list(found.values())


def collection_plan(view, collection=COLLECTION):
    """Keep the tensors marked with `memgrad.mark_checkpoint` that lie in this forward pass.

    A graph with no marked tensor at all is the caller's mistake (ValueError). Marks that
    all lie off this call's paths (a gradient of a gradient, whose marks are in the first
    forward pass; a second model in the same step) give an empty plan: plain tf.gradients,
    with a warning.
    """
    marked = view.graph.get_collection(collection)
    tensors = [t for t in marked if isinstance(t, tf.Tensor) and view.is_forward(t.op)]
    if not marked:
        raise ValueError(
            "checkpoints='collection' found no marked tensor between xs and ys. Mark "
            "tensors with memgrad.mark_checkpoint(t) or the memgrad.layers.Checkpoint layer "
            "inside the traced function. Received: 0 marked tensors in the graph."
        )
    return _plan_from_tensors(view, "collection", tensors)


def list_plan(view, tensors):
    """Keep exactly the given tensors; each must be a forward tensor of this graph."""
    checked = []
    for t in tensors:
        if not tf.is_symbolic_tensor(t):
            raise TypeError(
                "checkpoints must be 'memory', 'speed', 'collection' or a list of graph "
                f"tensors. Received an element of type {type(t).__name__}: {t!r}"
            )
        if t.graph is not view.graph:
            raise ValueError(
                f"Checkpoint {t.name} belongs to another graph than ys. Received a tensor "
                "from a different tf.function or graph."
            )
        if not view.is_forward(t.op):
            raise ValueError(
                f"Checkpoint {t.name} is not on a path from xs to ys, so it cannot split "
                "the backward pass. Expected tensors computed from xs that ys depend on."
            )
        checked.append(t)
    return _plan_from_tensors(view, "list", checked)
