"""Test-only exact optimum of the budget planner's problem, for small graphs.

Under `MemoryModel.predict`, a plan is a set of cut positions; between cuts ``a < b`` the
segment's peak is the bytes kept so far plus ``segment_bytes(a, b)``, the bytes kept grow by
``new_bytes(a, b)`` and the recomputation by ``segment_flops(a, b)``. For one budget the
cheapest plan is then a shortest path with a resource (the kept bytes): a label at each
position holds (kept bytes, FLOPs), a label is dropped only when another at the same
position keeps no more and recomputes no more. Nothing is bucketed, so the answer is the
optimum over the given positions (checked against brute force over every subset in
test_optimum.py). Exponential in the worst case: for graphs of a few dozen positions.
"""


def _pareto(labels):
    """The labels (kept, flops, cuts) no other label dominates (keeps <= and costs <=)."""
    labels.sort(key=lambda label: (label[0], label[1]))
    front, cheapest = [], float("inf")
    for label in labels:
        if label[1] < cheapest:
            front.append(label)
            cheapest = label[1]
    return front


def exact_plan(model, positions, budget):
    """``(flops, peak, cuts)`` of the least-recomputation plan over ``positions`` whose
    predicted peak fits ``budget``, or None when none does."""
    n = model.n
    positions = sorted(int(p) for p in positions if 0 <= p < n - 1)
    forced = model.forced_bytes
    labels = {-1: [(forced, 0.0, ())]}
    best = None
    for b in positions + [None]:
        arrived = []
        for a, front in labels.items():
            for kept, flops, cuts in front:
                if b is None:
                    peak_final = kept + model.segment_bytes(a, n - 1)
                    if peak_final <= budget and (best is None or flops < best[0]):
                        best = (flops, cuts)
                    continue
                if kept + model.segment_bytes(a, b) > budget:
                    continue
                arrived.append((kept + model.new_bytes(a, b), flops + model.segment_flops(a, b),
                                cuts + (b,)))
        if b is not None:
            front = _pareto(arrived)
            if front:
                labels[b] = front
    if best is None:
        return None
    flops, cuts = best
    peak, predicted_flops = model.predict(list(cuts))
    return predicted_flops, peak, list(cuts)
