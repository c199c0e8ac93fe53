"""An emulated small device: run a workload in a subprocess whose CPU allocator is capped.

TensorFlow's CPU allocator can be replaced by the BFC allocator with a hard limit
(``TF_CPU_ALLOCATOR_USE_BFC=true``, ``TF_CPU_BFC_MEM_LIMIT_IN_MB=N``); an allocation
past the limit raises ``ResourceExhaustedError``, just as on a GPU that is full.
The variables must be set before TensorFlow is imported, hence the subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

from memgrad.profiler.report import format_bytes, parse_bytes

RESULT_MARKER = "MEMGRAD_CAPPED_RESULT "


class CappedRunError(RuntimeError):
    """The workload failed in its subprocess for a reason other than running out of memory."""


@dataclasses.dataclass(frozen=True)
class CappedRun:
    """The outcome of one run on the emulated device.

    Attributes:
      target: the ``module:function`` that ran.
      kwargs: the keyword arguments it was called with.
      limit_bytes: the allocator cap.
      fits: ``True`` if the call finished, ``False`` if it ran out of memory.
      peak_bytes: the allocator's peak (for a run that fits), else ``None``.
      message: the out-of-memory message for a run that did not fit.
      wall_time_s: wall time of the whole subprocess, TensorFlow's import included.
    """

    target: str
    kwargs: dict
    limit_bytes: int
    fits: bool
    peak_bytes: int | None
    message: str
    wall_time_s: float

    def __str__(self) -> str:
        outcome = f"fits (peak {format_bytes(self.peak_bytes)})" if self.fits else "out of memory"
        return f"{self.target}({self.kwargs}) under {format_bytes(self.limit_bytes)}: {outcome}"


def _check_target(target) -> str:
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise ValueError(
            "Expected the workload as an importable 'module:function' string, e.g. "
            f"'memgrad.profiler.workloads:mlp_training_step'. Received: {target!r}"
        )
    return target


def _limit_in_mib(limit) -> int:
    limit_bytes = parse_bytes(limit)
    limit_mib = limit_bytes // 2**20
    if limit_mib < 1:
        raise ValueError(f"Expected a memory limit of at least 1 MiB. Received: {limit!r}")
    return limit_mib


def run_capped(target, limit, kwargs=None, *, timeout=600.0) -> CappedRun:
    """Runs ``target(**kwargs)`` in a subprocess whose CPU allocator is capped at ``limit``.

    The subprocess sees no GPU, so the same run emulates a device of ``limit``
    bytes on any machine. Everything TensorFlow allocates there counts towards the
    cap, its runtime's own buffers included.

    Args:
      target: ``'module:function'``; the module must be importable with the
        caller's ``sys.path``. The function may return nothing.
      limit: the cap, in bytes or as a string such as ``'256MiB'`` (rounded down
        to whole MiB, at least 1 MiB).
      kwargs: JSON-serialisable keyword arguments for the function.
      timeout: seconds before the subprocess is killed.

    Returns:
      A `CappedRun`; ``fits`` says whether the call finished under the cap.

    Raises:
      ValueError: for a malformed target or limit.
      CappedRunError: if the workload failed for another reason (import error,
        exception, crash, timeout); the message carries the subprocess's error.

    Example:
      >>> run = run_capped("memgrad.profiler.workloads:mlp_training_step", "512MiB",
      ...                  {"batch_size": 32, "depth": 4, "width": 64})
      >>> run.fits
      True
    """
    target = _check_target(target)
    limit_mib = _limit_in_mib(limit)
    kwargs = dict(kwargs or {})
    payload = json.dumps({"target": target, "kwargs": kwargs})

    env = dict(os.environ)
    env.update(
        TF_CPU_ALLOCATOR_USE_BFC="true",
        TF_CPU_BFC_MEM_LIMIT_IN_MB=str(limit_mib),
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="-1",
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
    )
    start = time.perf_counter()
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "memgrad.profiler._capped_worker", payload],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise CappedRunError(f"{target} did not finish within {timeout} s") from error
    elapsed = time.perf_counter() - start

    result = None
    for line in completed.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            result = json.loads(line[len(RESULT_MARKER):])
    if result is None or result["status"] == "error":
        detail = result["message"] if result else completed.stderr.strip()[-2000:]
        raise CappedRunError(
            f"{target}({kwargs}) failed in its capped subprocess "
            f"(exit code {completed.returncode}): {detail}"
        )
    return CappedRun(
        target=target,
        kwargs=kwargs,
        limit_bytes=limit_mib * 2**20,
        fits=result["status"] == "ok",
        peak_bytes=result.get("peak_bytes"),
        message=result.get("message", ""),
        wall_time_s=elapsed,
    )


@dataclasses.dataclass(frozen=True)
class BatchSearch:
    """The result of `max_batch_size`.

    Attributes:
      batch_size: the largest batch found to fit (0 if even the smallest did not).
      limit_bytes: the cap searched under.
      probes: every `CappedRun` made, in order.
    """

    batch_size: int
    limit_bytes: int
    probes: tuple


def max_batch_size(target, limit, kwargs=None, *, batch_arg="batch_size", low=1,
                   high=4096, timeout=600.0) -> BatchSearch:
    """Finds the largest batch size for which ``target`` fits under ``limit`` bytes.

    Doubles the batch from ``low`` until a run does not fit (or ``high`` is
    reached), then bisects between the last fitting and first failing size. Each
    probe is one `run_capped` subprocess.

    Args:
      target: ``'module:function'`` taking the batch size as keyword ``batch_arg``.
      limit: the cap, in bytes or as a string such as ``'256MiB'``.
      kwargs: other keyword arguments for the function.
      batch_arg: the name of the batch-size keyword.
      low: the smallest batch size tried.
      high: the largest batch size tried.
      timeout: seconds allowed for each probe.

    Returns:
      A `BatchSearch` with the largest fitting ``batch_size`` and all probes.

    Raises:
      ValueError: for bad bounds, target or limit.
      CappedRunError: if a probe fails for a reason other than memory.

    Example:
      >>> search = max_batch_size("memgrad.profiler.workloads:mlp_training_step",
      ...                         "128MiB", {"depth": 8, "width": 256})
      >>> search.batch_size > 0
      True
    """
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
        raise ValueError(f"Expected integers 1 <= low <= high. Received: low={low!r}, high={high!r}")
    probes = []

    def fits(batch):
        run = run_capped(target, limit, {**(kwargs or {}), batch_arg: batch}, timeout=timeout)
        probes.append(run)
        return run.fits

    if not fits(low):
        return BatchSearch(0, _limit_in_mib(limit) * 2**20, tuple(probes))
    good, bad = low, None
    while bad is None and good < high:
        candidate = min(good * 2, high)
        if fits(candidate):
            good = candidate
        else:
            bad = candidate
    while bad is not None and bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return BatchSearch(good, _limit_in_mib(limit) * 2**20, tuple(probes))
