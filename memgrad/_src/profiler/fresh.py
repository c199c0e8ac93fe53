"""Calls in fresh processes: a clean allocator, environment variables read at TensorFlow's import.

A peak measured in a fresh process is that call's own: no earlier allocation, cache or
compiled function of the caller's process moves it, and allocator settings
(``TF_CPU_ALLOCATOR_USE_BFC``, ``TF_CPU_BFC_MEM_LIMIT_IN_MB``, ``TF_ENABLE_ONEDNN_OPTS``)
take effect because TensorFlow is imported afresh. The emulated device (`run_capped`) runs
its workloads through `run_in_fresh_process`; memgrad's memory tests run their probes
through `FreshProcessPool`, so that a few overlap the rest of the suite.

A target is an importable ``'module:function'``; its arguments and its return value travel
as JSON.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import json
import os
import subprocess
import sys
import threading

RESULT_MARKER = "MEMGRAD_FRESH_RESULT "
# "1": fresh processes fork from a warm interpreter by default (`memgrad._src.profiler.warm`).
# Test suites set it (tests/conftest.py): each cold start imports TensorFlow again.
WARM_ENV = "MEMGRAD_FRESH_WARM"
# Run as a script: the process imports nothing before the target's module, memgrad included.
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fresh_worker.py")


class FreshProcessError(RuntimeError):
    """The call failed in its fresh process: import error, exception, crash or timeout.

    Attributes:
      detail: the process's own account: the traceback, the end of its stderr, or why it stopped.
      returncode: the process's exit code (negative: the signal that ended it), ``None`` if it
        was killed for its timeout.
    """

    def __init__(self, message, detail="", returncode=None):
        super().__init__(message)
        self.detail = detail
        self.returncode = returncode


def check_target(target) -> str:
    """Returns ``target`` if it is a ``'module:function'`` string, else raises ValueError."""
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise ValueError(
            "Expected the workload as an importable 'module:function' string, e.g. "
            f"'memgrad.profiler.workloads:mlp_training_step'. Received: {target!r}"
        )
    return target


def load_target(target):
    """The function a ``'module:function'`` target names, imported; an ImportError naming the
    target if it cannot be."""
    module_name, function_name = check_target(target).split(":")
    try:
        return getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot import {target}: {error}") from None


def _environment(env):
    environment = dict(os.environ)
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The target must import as it does here.
    environment["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for name, value in (env or {}).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = str(value)
    return environment


class FreshProcess:
    """One call of ``target(*args, **kwargs)`` in a fresh Python process (see `start`).

    Attributes:
      target: the ``'module:function'``.
      args: positional arguments (JSON-serialisable).
      kwargs: keyword arguments (JSON-serialisable).
      returncode: the process's exit code once it has finished, else ``None``.

    With ``warm=True`` the process is forked from a warm interpreter that has imported
    TensorFlow and Keras and run no op (`memgrad._src.profiler.warm`): the same clean allocator
    and environment, without seconds of import, but TensorFlow is imported before the target's
    module. ``warm=None`` reads ``MEMGRAD_FRESH_WARM`` ("1": warm).
    """

    def __init__(self, target, args=(), kwargs=None, *, env=None, timeout=600.0, cwd=None, warm=None):
        self.target = check_target(target)
        self.args = list(args)
        self.kwargs = dict(kwargs or {})
        self._request = {"target": self.target, "args": self.args, "kwargs": self.kwargs,
                         "marker": RESULT_MARKER}
        self._env = _environment(env)
        self._timeout = timeout
        self._cwd = cwd
        self._warm = os.environ.get(WARM_ENV) == "1" if warm is None else bool(warm)
        self._process = None
        self._killed = False
        self.returncode = None

    def start(self) -> "FreshProcess":
        """Starts the process (once) and returns ``self`` without waiting."""
        if self._process is None and self._warm:
            from memgrad._src.profiler import warm

            self._process = warm.spawn(self._request, self._env, self._cwd)
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, _WORKER],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env=self._env, cwd=self._cwd,
            )
        return self

    def kill(self) -> None:
        """Kills the process if it is running; `result` then raises FreshProcessError."""
        self._killed = True
        if self._process is not None and self._process.poll() is None:
            self._process.kill()

    def result(self):
        """Waits for the call (starting it if needed) and returns what the target returned.

        Raises:
          FreshProcessError: if the target could not be imported, raised, crashed, was killed
            or did not finish within the timeout; the message carries its error.
        """
        self.start()
        description = f"{self.target}(*{self.args}, **{self.kwargs})"
        try:
            out, err = self._process.communicate(json.dumps(self._request), timeout=self._timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            out, err = self._process.communicate()
            detail = f"did not finish within {self._timeout} s"
            raise FreshProcessError(f"{description} {detail}:\n{err[-3000:]}", detail) from None
        self.returncode = self._process.returncode
        result = None
        for line in out.splitlines():
            if line.startswith(RESULT_MARKER):
                result = json.loads(line[len(RESULT_MARKER):])
        if result is None or result["status"] != "ok":
            if result is not None:
                detail = result["message"]
            elif self._killed:
                detail = "killed"
            else:
                detail = err.strip()[-3000:]
            raise FreshProcessError(
                f"{description} failed in its fresh process (exit code {self.returncode}): {detail}", detail,
                self.returncode)
        return result["value"]


def run_in_fresh_process(target, args=(), kwargs=None, *, env=None, timeout=600.0, cwd=None, warm=None):
    """Calls ``target(*args, **kwargs)`` in a fresh Python process and returns its result.

    The process imports nothing before the target's module (its import may still set
    environment variables that TensorFlow reads at import).

    Args:
      target: ``'module:function'``, importable with the caller's ``sys.path``.
      args: positional arguments, JSON-serialisable.
      kwargs: keyword arguments, JSON-serialisable.
      env: environment variables for the process on top of the caller's (a ``None`` value
        removes the variable), e.g. ``{"TF_CPU_ALLOCATOR_USE_BFC": "true"}``.
      timeout: seconds before the process is killed.
      cwd: the process's working directory (default: the caller's).
      warm: fork the process from a warm interpreter (see `FreshProcess`); None reads
        ``MEMGRAD_FRESH_WARM``.

    Returns:
      The target's return value, through JSON (tuples come back as lists).

    Raises:
      ValueError: for a malformed target.
      FreshProcessError: if the call failed (import error, exception, crash, timeout); the
        message carries the process's error.

    Example:
      >>> run_in_fresh_process("math:factorial", [10])   # e.g. a workload measuring its peak
      3628800
    """
    return FreshProcess(target, args, kwargs, env=env, timeout=timeout, cwd=cwd, warm=warm).result()


class FreshProcessPool:
    """Runs calls in fresh processes in the background, at most ``max_workers`` at a time.

    `submit` returns a `concurrent.futures.Future` whose result is the target's return value
    (or raises FreshProcessError). `shutdown` cancels the calls not started and kills the
    running ones.

    Example:
      >>> with FreshProcessPool(max_workers=2) as pool:
      ...     futures = [pool.submit("math:factorial", [n]) for n in (5, 10)]
      ...     [future.result() for future in futures]
      [120, 3628800]
    """

    def __init__(self, max_workers=2):
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="memgrad-fresh")
        self._running = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, target, args=(), kwargs=None, *, env=None, timeout=600.0,
               cwd=None, warm=None) -> concurrent.futures.Future:
        """Queues ``target(*args, **kwargs)`` (see `run_in_fresh_process`) and returns its future."""
        process = FreshProcess(target, args, kwargs, env=env, timeout=timeout, cwd=cwd, warm=warm)
        return self._executor.submit(self._run, process)

    def _run(self, process):
        with self._lock:
            if self._closed:
                raise FreshProcessError(f"{process.target}: the pool was shut down")
            self._running.add(process.start())
        try:
            return process.result()
        finally:
            with self._lock:
                self._running.discard(process)

    def shutdown(self, kill=True) -> None:
        """Cancels queued calls; kills the running ones (``kill=True``) or waits for them."""
        with self._lock:
            self._closed = kill
            running = list(self._running)
        if kill:
            for process in running:
                process.kill()
        self._executor.shutdown(wait=not kill, cancel_futures=kill)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.shutdown(kill=exc_info[0] is not None)
