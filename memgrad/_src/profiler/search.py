"""The batch-size search both finders use: `max_batch_size` (runs under a cap) and
`predict_max_batch_size` (traced predictions). Each probe is costly (a subprocess, a trace),
so the search aims each one where the peaks seen so far say the limit is."""

from __future__ import annotations


def check_search_arguments(low, high, start, rtol):
    """Raises ValueError for bounds, a first guess or a tolerance the search cannot use."""
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
        raise ValueError(f"Expected integers 1 <= low <= high. Received: low={low!r}, high={high!r}")
    if start is not None and not (isinstance(start, int) and low <= start <= high):
        raise ValueError(f"Expected start to be an int in [low, high] = [{low}, {high}]. Received: {start!r}")
    if not (isinstance(rtol, (int, float)) and 0 <= rtol < 1):
        raise ValueError(f"Expected 0 <= rtol < 1. Received: {rtol!r}")


def largest_fitting(probe, low, high, limit_bytes, *, start=None, rtol=0.0, aim=True):
    """The largest batch size in ``[low, high]`` for which ``probe`` fits, in few probes.

    From ``start`` (default ``low``) it halves while a size does not fit. Then it grows the
    batch: to the size where a line through the fitting peaks meets the limit (5% past it,
    so the limit is bracketed at once), or at least doubling with ``aim=False``; an aim that
    is too cautious (peaks that do not grow with the batch) still moves 1, 4, 16, ... times
    ``max(1, rtol * batch)`` sizes in successive such probes, never further than an aim
    that moves more. Once a size fails, it interpolates between the largest fit and the smallest
    failure (their peaks, where the failure's is known, else the line), bisecting whenever
    an interpolation shrank the gap by less than half. Either way O(log) probes.

    Args:
      probe: ``probe(batch) -> (fits, peak_bytes)``; ``peak_bytes`` may be None (unknown).
      low, high: the bounds, ``1 <= low <= high``.
      limit_bytes: the limit the peaks are compared with.
      start: the first size tried (default ``low``).
      rtol: stop once the smallest failure is within ``rtol`` of the largest fit (0: exact).
      aim: whether to aim at the extrapolated limit while growing (else double).

    Returns:
      The largest size found to fit, or 0 when ``low`` does not.
    """
    peaks = {}  # batch -> peak bytes, of fitting and (where known) failing sizes

    def fits(batch):
        ok, peak = probe(batch)
        if peak:
            peaks[batch] = peak
        return ok

    good, bad, candidate = None, None, low if start is None else start
    while good is None:  # from the first guess down, halving, to a size that fits
        if fits(candidate):
            good = candidate
        elif candidate == low:
            return 0
        else:
            bad, candidate = candidate, max(low, candidate // 2)
    boost, halve = 1, False
    while good < high and (bad is None or bad - good > max(1, rtol * good)):
        step = max(1, int(rtol * good))
        width = None if bad is None else bad - good
        if bad is None:
            guess = _extrapolated(peaks, good, limit_bytes) if aim else None
            least = good + step * boost
            if guess is not None and guess > least:  # an aim that moves: taken as it is
                candidate = guess
            else:  # too cautious, or no aim: the least move grows fourfold per probe
                candidate = max(guess or 2 * good, least)
                boost *= 4
        elif halve:
            candidate = (good + bad) // 2
        else:
            candidate = _interpolated(peaks, good, bad, limit_bytes)
        candidate = min(max(candidate, good + step), high if bad is None else bad - 1)
        if candidate <= good:
            break
        if fits(candidate):
            good = candidate
        else:
            bad = candidate
        halve = width is not None and not halve and bad - good > width / 2
    return good


def _extrapolated(peaks, good, limit_bytes, past=0.05):
    """Where a line through the two largest fitting sizes' peaks (through zero with one)
    meets the limit, ``past`` beyond it (a share of the way there); None when the peaks do
    not grow."""
    fitting = sorted(b for b in peaks if b <= good and peaks[b] <= limit_bytes)
    if not fitting:
        return None
    if len(fitting) == 1:
        b1 = fitting[0]
        return int(b1 * limit_bytes / max(peaks[b1], 1))
    b0, b1 = fitting[-2], fitting[-1]
    slope = (peaks[b1] - peaks[b0]) / (b1 - b0)
    if slope <= 0:
        return None
    return int(b1 + (1.0 + past) * (limit_bytes - peaks[b1]) / slope) + (1 if past else 0)


def _interpolated(peaks, good, bad, limit_bytes):
    """Between the largest fit and the smallest failure: where the line through their peaks
    meets the limit, or, without the failure's peak, through the fitting ones; else halfway.
    Halfway too when that line puts the limit at or past the failure: it was just shown wrong
    there, and a probe one below a failure would most likely fail again (about 14 s on the
    emulated device)."""
    if good in peaks and bad in peaks and peaks[bad] > peaks[good]:
        return good + int((limit_bytes - peaks[good]) * (bad - good) / (peaks[bad] - peaks[good]))
    guess = _extrapolated(peaks, good, limit_bytes, past=0.0)
    if guess is None or guess >= bad:
        return (good + bad) // 2
    return max(guess, good + 1)
