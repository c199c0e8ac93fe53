"""Memory probes: scripts under tests/ measured in fresh processes, started as soon as collected.

A peak measured in a fresh process is that process's own allocator's. The probes take most of
the suite's wall time while the test process itself idles, so a test module declares its
probes at import (`declare`), `tests/conftest.py` starts every selected module's probes when
collection finishes (two processes at a time, in collection order), and the module's fixture
collects the results (`results`) when its tests come up; other tests run meanwhile.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = 2  # processes at a time, besides the test process

_specs = {}  # key -> dict(owner, module, arguments, marker, env, timeout)
_futures = {}  # key -> list of futures, one per process
_pool = None
_running = set()
_lock = threading.Lock()


def declare(key, module, arguments, marker, env=None, owner=None, timeout=900):
    """Declares the probe processes a test module needs (call at module level).

    Args:
      key: a name for `results`.
      module: the probe's module, e.g. ``"tests.models.memory_probe"``.
      arguments: a list of argument lists, one process each.
      marker: the probe prints ``marker`` followed by its JSON result on stdout.
      env: environment variables to set (``None`` values remove a variable).
      owner: the declaring test module's ``__name__``; its probes start when any of its tests
        is selected.
      timeout: seconds per process.

    Returns:
      ``key``.
    """
    _specs[key] = dict(owner=owner, module=module, arguments=[list(a) for a in arguments],
                       marker=marker, env=env or {}, timeout=timeout)
    return key


def owners():
    """The test modules that declared probes."""
    return {spec["owner"] for spec in _specs.values()}


def start(keys):
    """Starts the processes of the declared probes ``keys`` not started yet, in order."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=JOBS, thread_name_prefix="probe")
        for key in keys:
            if key not in _futures:
                spec = _specs[key]
                _futures[key] = [_pool.submit(_run, spec, args) for args in spec["arguments"]]


def start_for(module_names):
    """Starts the probes declared by the given test modules (in the order given)."""
    order = {name: i for i, name in enumerate(module_names)}
    keys = [key for key, spec in _specs.items() if spec["owner"] in order]
    start(sorted(keys, key=lambda k: order[_specs[k]["owner"]]))


def results(key):
    """The parsed results of probe ``key``, one per argument list (starting it if needed)."""
    start([key])
    return [future.result() for future in _futures[key]]


def stop():
    """Cancels queued probes and kills running ones (end of session)."""
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
    with _lock:
        for process in list(_running):
            process.kill()


def _run(spec, args):
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    for name, value in spec["env"].items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    process = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-m", spec["module"], *args],
        cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    with _lock:
        _running.add(process)
    try:
        out, err = process.communicate(timeout=spec["timeout"])
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    finally:
        with _lock:
            _running.discard(process)
    if process.returncode != 0 or spec["marker"] not in out:
        raise AssertionError(f"probe {spec['module']} {' '.join(args)} failed "
                             f"(exit {process.returncode}):\n{err[-3000:]}")
    return json.loads(out.split(spec["marker"], 1)[1])
