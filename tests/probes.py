"""Runs memory probes (scripts under tests/) in fresh processes, two at a time.

A peak measured in a fresh process is that process's own allocator's; running two at a time
(one per core on the 2-core CI machine) halves the wait without sharing an allocator.
"""

import concurrent.futures
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_probes(module, arguments, marker, env=None, jobs=2, timeout=900):
    """Runs ``python -m module *args`` for each entry of ``arguments``, ``jobs`` at a time.

    Args:
      module: the probe's module, e.g. ``"tests.models.memory_probe"``.
      arguments: a list of argument lists, one process each.
      marker: the probe prints ``marker`` followed by its JSON result on stdout.
      env: environment variables to set (``None`` values remove a variable).
      jobs: processes at a time.
      timeout: seconds per process.

    Returns:
      The parsed results, in the order of ``arguments``.
    """
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value

    def run(args):
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "-m", module, *args],
            cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout,
        )
        if done.returncode != 0 or marker not in done.stdout:
            raise AssertionError(f"probe {module} {' '.join(args)} failed "
                                 f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.split(marker, 1)[1])

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run, arguments))
