"""An emulated small device: run a workload in a subprocess whose CPU allocator is capped.

TensorFlow's CPU allocator can be replaced by the BFC allocator with a hard limit
(``TF_CPU_ALLOCATOR_USE_BFC=true``, ``TF_CPU_BFC_MEM_LIMIT_IN_MB=N``); an allocation
past the limit raises ``ResourceExhaustedError``, just as on a GPU that is full.
The variables must be set before TensorFlow is imported, hence the subprocess
(`memgrad._src.profiler.fresh.run_in_fresh_process`).
"""

from __future__ import annotations

import dataclasses
import re
import time

from memgrad._src.profiler.fresh import FreshProcessError, check_target, run_in_fresh_process
from memgrad._src.profiler.search import check_search_arguments, largest_fitting
from memgrad._src.units import format_bytes, parse_bytes


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
      oom_report: for a run that did not fit with ``explain=True``, what was alive when it
        failed (an `OutOfMemoryReport`), else ``None``.
    """

    target: str
    kwargs: dict
    limit_bytes: int
    fits: bool
    peak_bytes: int | None
    message: str
    wall_time_s: float
    oom_report: object = None

    def __str__(self) -> str:
        outcome = f"fits (peak {format_bytes(self.peak_bytes)})" if self.fits else "out of memory"
        return f"{self.target}({self.kwargs}) under {format_bytes(self.limit_bytes)}: {outcome}"


def _limit_in_mib(limit) -> int:
    limit_bytes = parse_bytes(limit)
    limit_mib = limit_bytes // 2**20
    if limit_mib < 1:
        raise ValueError(f"Expected a memory limit of at least 1 MiB. Received: {limit!r}")
    return limit_mib


def run_capped(target, limit, kwargs=None, *, timeout=600.0, explain=False, env=None) -> CappedRun:
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
      explain: if the call runs out of memory, run it once more under TensorFlow's profiler
        and attach an `OutOfMemoryReport` (``oom_report``): the tensors alive at the failure.
      env: optional extra environment variables for the subprocess, e.g.
        ``{"TF_ENABLE_ONEDNN_OPTS": "0"}`` to run TensorFlow's other CPU kernels; the
        variables that set the cap cannot be overridden.

    Returns:
      A `CappedRun`; ``fits`` says whether the call finished under the cap. A process that
      crashed right after TensorFlow logged an out-of-memory (what a oneDNN kernel does when its
      allocation fails, on CPUs where TensorFlow turns oneDNN on) did not fit; its ``message``
      says so, and it has no ``oom_report``.

    Raises:
      ValueError: for a malformed target or limit.
      CappedRunError: if the workload failed for another reason (import error,
        exception, a crash with no OOM before it, timeout); the message carries the
        subprocess's error.

    Example:
      >>> run = run_capped("memgrad.profiler.workloads:mlp_training_step", "512MiB",
      ...                  {"batch_size": 32, "depth": 4, "width": 64})
      >>> run.fits
      True
    """
    target = check_target(target)
    limit_mib = _limit_in_mib(limit)
    kwargs = dict(kwargs or {})
    extra = _checked_env(env)
    env = dict(
        TF_CPU_ALLOCATOR_USE_BFC="true",
        TF_CPU_BFC_MEM_LIMIT_IN_MB=str(limit_mib),
        # Warnings kept (the stderr is only read here): a crash after a failed allocation is
        # recognised by TensorFlow's warning line naming the OOM (`_crashed_out_of_memory`).
        TF_CPP_MIN_LOG_LEVEL="1",
        CUDA_VISIBLE_DEVICES="-1",
    )
    clash = sorted(set(extra) & set(env))
    if clash:
        raise ValueError(f"Expected env without the variables that set the cap ({', '.join(sorted(env))}). "
                         f"Received: {', '.join(clash)}")
    env = {**extra, **env}
    start = time.perf_counter()
    try:
        result = run_in_fresh_process("memgrad._src.profiler._capped_worker:call_capped",
                                      kwargs={"target": target, "kwargs": kwargs, "explain": bool(explain)},
                                      env=env, timeout=timeout)
    except FreshProcessError as error:
        message = _crashed_out_of_memory(error)
        if message is None:
            how = (f"crashed (signal {-error.returncode})" if error.returncode is not None and error.returncode < 0
                   else "failed")
            raise CappedRunError(f"{target}({kwargs}) {how} in its capped subprocess: {error.detail}") from error
        result = {"status": "oom", "message": message}
    elapsed = time.perf_counter() - start
    return CappedRun(
        target=target,
        kwargs=kwargs,
        limit_bytes=limit_mib * 2**20,
        fits=result["status"] == "ok",
        peak_bytes=result.get("peak_bytes"),
        message=result.get("message", ""),
        wall_time_s=elapsed,
        oom_report=_report_from_dict(result.get("report")),
    )


def _checked_env(env) -> dict:
    if env is None:
        return {}
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise TypeError(f"Expected env to be a dict of str to str, or None. Received: {env!r}")
    return dict(env)


_OOM_LOGGED = re.compile(r"RESOURCE_EXHAUSTED: (OOM when allocating[^\n]*)")


def _crashed_out_of_memory(error):
    """The OOM message of a capped process that an allocation failure crashed, else ``None``.

    Under the cap, a oneDNN kernel (TensorFlow's default on CPUs with AVX-512) whose
    allocation fails logs the failure and then crashes the process (a segfault, TensorFlow
    2.21) instead of raising ResourceExhaustedError. A process ended by a signal right after
    logging an OOM ran out of memory: the run did not fit.
    """
    if error.returncode is None or error.returncode >= 0:
        return None
    found = _OOM_LOGGED.findall(error.detail or "")
    if not found:
        return None
    return (f"{found[-1].strip()} (the process then crashed with signal {-error.returncode}: a oneDNN "
            "kernel does not survive a failed allocation; set TF_ENABLE_ONEDNN_OPTS=0 to get a report)")


def _report_from_dict(data):
    """An `OutOfMemoryReport` rebuilt from its ``as_dict`` form (``None`` stays ``None``)."""
    if not data:
        return None
    from memgrad._src.profiler.live import LiveTensor, MemoryCategories
    from memgrad._src.profiler.oom import OutOfMemoryReport

    memory = dict(data["memory"])
    memory["tensors"] = tuple(LiveTensor(**t) for t in memory["tensors"])
    return OutOfMemoryReport(device=data["device"], message=data["message"], memory=MemoryCategories(**memory))


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
                   high=4096, timeout=600.0, start=None, rtol=0.0, on_probe=None,
                   env=None) -> BatchSearch:
    """Finds the largest batch size for which ``target`` fits under ``limit`` bytes.

    Grows the batch from ``low`` (at least doubling) until a run does not fit (or
    ``high`` is reached), then closes in between the last fitting and first failing
    size. Each probe is one `run_capped` subprocess. With a ``start`` guess (e.g.
    extrapolated from a measured peak) the search begins there (halving while runs do
    not fit) and then aims each probe at the size where a line through the fitting
    runs' peaks meets the cap: a handful of probes instead of a dozen. The search is the
    one `predict_max_batch_size` uses.

    Args:
      target: ``'module:function'`` taking the batch size as keyword ``batch_arg``.
      limit: the cap, in bytes or as a string such as ``'256MiB'``.
      kwargs: other keyword arguments for the function.
      batch_arg: the name of the batch-size keyword.
      low: the smallest batch size tried.
      high: the largest batch size tried.
      timeout: seconds allowed for each probe.
      start: an optional first guess in ``[low, high]``.
      rtol: stop bisecting once the first failing size is within ``rtol`` of the
        largest fitting one (``0``: exact).
      on_probe: an optional callable, called with each probe's `CappedRun` as soon as it
        ends (e.g. to show progress: each probe takes seconds).
      env: optional extra environment variables for each probe's subprocess (as in
        `run_capped`).

    Returns:
      A `BatchSearch` with the largest fitting ``batch_size`` (a size that ran under
      the cap) and all probes.

    Raises:
      ValueError: for bad bounds, target or limit.
      CappedRunError: if a probe fails for a reason other than memory.

    Example:
      >>> search = max_batch_size("memgrad.profiler.workloads:mlp_training_step",
      ...                         "128MiB", {"depth": 8, "width": 256}, low=64, high=256)
      >>> search.batch_size > 0
      True
    """
    check_search_arguments(low, high, start, rtol)
    if on_probe is not None and not callable(on_probe):
        raise TypeError(f"Expected on_probe to be a callable or None. Received: {on_probe!r}")
    _checked_env(env)
    probes = []

    def probe(batch):
        run = run_capped(target, limit, {**(kwargs or {}), batch_arg: batch}, timeout=timeout, env=env)
        probes.append(run)
        if on_probe is not None:
            on_probe(run)
        return run.fits, run.peak_bytes if run.fits else None

    limit_bytes = _limit_in_mib(limit) * 2**20
    # Without a guess, plain doubling: the first sizes' peaks are mostly the runtime's own.
    good = largest_fitting(probe, low, high, limit_bytes, start=start, rtol=rtol,
                           aim=start is not None)
    return BatchSearch(good, limit_bytes, tuple(probes))
