"""A Budget's walk through one graph's candidate plans, by their simulated peaks.

`BudgetWalk` is what `Budget.plan` hands to `Budget.refine` (the plan's declared
``strategy_state``). It is immutable: each step of the walk makes a new one, so a plan holds
the walk as it stood when the plan was made, and nothing changes it afterwards.
"""

import dataclasses

# A candidate whose memory-model peak (scaled to plain's simulated peak) is over
# this multiple of the target is tried only after the others (see `walk_order`).
SKIP_ABOVE = 1.25


@dataclasses.dataclass(frozen=True)
class BudgetWalk:
    """One graph's walk: what is fixed for it, then what the walk has found so far."""

    planner: object  # the `Planner` of the graph (its memory model and candidates)
    scale: float  # plain backprop's simulated peak over its modelled peak
    plain_bytes: float
    budget_bytes: float
    target_bytes: float  # the budget less the margin
    start: float  # time.perf_counter() when planning began
    source: str = "model"  # where the peaks come from: 'simulated' or 'model'
    margin: float = 0.0
    kernels: str = None  # the device whose kernels' scratch the simulations count, or None
    hold: bool = True  # gradients alive to the end of the backward pass (`hold_gradients`)
    loops: int = 0  # While ops in the forward region, whose per-step memory is not modelled
    tried: tuple = ()  # peaks found, in the order tried
    peaks: tuple = ()  # (candidate index, its peak), in the order found
    chosen: int = None  # the candidate a bisection found to fit, rebuilt after it
    search: tuple = None  # a bisection's (lo, hi): none below lo fits, hi fits (or is len)
    own: tuple = (None, None)  # (model budget, cuts) of the model's own plan for the target
    refined: bool = False  # whether `Budget._refined` added its candidate
    order: tuple = ()  # candidate indices, in trial order
    candidates: tuple = ()  # (cost, model peak, cuts)

    def replace(self, **changes):
        """A new walk with ``changes``."""
        return dataclasses.replace(self, **changes)

    def with_peak(self, index, peak):
        """A new walk that has found candidate ``index``'s ``peak``."""
        return self.replace(tried=self.tried + (peak,), peaks=self.peaks + ((index, peak),))

    @property
    def peak_by_candidate(self):
        """{candidate index: its peak}, for the candidates found so far."""
        return dict(self.peaks)


def walk_order(candidates, scale, target):
    """The order candidates are tried in: from the cheapest whose scaled model peak is within
    `SKIP_ABOVE` of the target (the cheaper ones are predicted too far over to be worth a
    simulation), up; then the skipped ones, cheapest first (the model can rank a plan too
    high). Every candidate is tried before a BudgetError. None when the model puts every
    candidate over that: it is then wrong about them (ResNet50's 'memory' plan: modelled at
    0.97 of plain's peak, measured at 0.41), and `Budget._bisect` searches by simulated peak."""
    start = next((i for i, (_, peak, _) in enumerate(candidates)
                  if peak * scale <= SKIP_ABOVE * target), None)
    if start is None:
        return None
    return tuple(range(start, len(candidates))) + tuple(range(start))


def next_candidate(walk, index, peak):
    """``(next index or None, walk)``: the candidate to try after ``index`` simulated ``peak``
    over the target (None when every candidate has been tried), and the walk with its order
    updated. The model's figures are rescaled by that peak (its peak over its scaled model
    peak): the candidates after it in the order that the rescaled model still puts over the
    target are moved to the end of the order, so the next one tried is the cheapest predicted
    to fit (they are still tried, before a BudgetError, should the rescaled model be wrong).
    Where none is predicted to fit, the next in the order."""
    position = walk.order.index(index) + 1
    rest = walk.order[position:]
    if not rest:
        return None, walk
    modelled = walk.candidates[index][1] * walk.scale
    ratio = peak / modelled if modelled > 0 else 1.0
    fitting = [i for i in rest if walk.candidates[i][1] * walk.scale * ratio <= walk.target_bytes]
    if fitting:
        first = rest.index(fitting[0])
        walk = walk.replace(order=walk.order[:position] + rest[first:] + rest[:first])
    return walk.order[position], walk
