"""Fresh processes forked from a warm interpreter (`FreshProcess` with ``warm=True``).

A fresh process spends most of its start importing TensorFlow: 5-8 CPU-seconds on a 2-core
machine, more than many measurements take. A warm interpreter (`_fresh_zygote.py`) imports
TensorFlow and Keras once, runs no op, and forks a child per call; the child sets its
environment before the target's module is imported, so what TensorFlow reads when it creates
its devices, allocator and thread pools (``TF_CPU_ALLOCATOR_USE_BFC``,
``TF_CPU_BFC_MEM_LIMIT_IN_MB``, ``TF_NUM_INTEROP_THREADS``) takes effect as in a fresh process,
and the child's allocator starts empty.

What it cannot give is an import of TensorFlow that the target itself orders: TensorFlow is
always imported first. Variables read at that import (oneDNN's switch, log levels, XLA and
Python flags: `_import_time_key`) are the warm interpreter's own, so there is one warm
interpreter per set of them. Calls that set up an import order (memgrad's import-order
checks) must stay cold.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading

_ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fresh_zygote.py")
# Read after TensorFlow's import (when its devices, allocator and thread pools are created).
_READ_AFTER_IMPORT = frozenset({"TF_CPU_ALLOCATOR_USE_BFC", "TF_CPU_BFC_MEM_LIMIT_IN_MB",
                                "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS", "PYTHONPATH"})
# Families of variables that TensorFlow, Keras, their libraries or Python may read at start.
_IMPORT_TIME_PREFIXES = ("TF_", "XLA_", "KERAS", "CUDA", "LD_", "OMP_", "KMP_", "MKL", "DNNL",
                         "ONEDNN", "PYTHON", "MALLOC", "GLIBC")
START_TIMEOUT_S = 600.0


def _import_time_key(env):
    """The variables of ``env`` that a warm interpreter fixes at its start."""
    return tuple(sorted((name, value) for name, value in env.items()
                        if name.startswith(_IMPORT_TIME_PREFIXES) and name not in _READ_AFTER_IMPORT))


class _WarmChild:
    """A call running in a child of a warm interpreter, with `subprocess.Popen`'s methods that
    `FreshProcess` uses: `communicate`, `kill`, `poll`, ``returncode``."""

    def __init__(self, call_id, out, err):
        self._id = call_id
        self._out, self._err = out, err
        self.pid = None
        self.returncode = None
        self.started = threading.Event()
        self.ended = threading.Event()

    def _ended(self, code):
        self.returncode = code
        self.started.set()
        self.ended.set()

    def poll(self):
        return self.returncode

    def kill(self):
        if self.pid is not None and not self.ended.is_set():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def communicate(self, _input=None, timeout=None):
        """Waits for the call to end; returns ``(stdout, stderr)``. The request travelled with
        the call, so ``_input`` is ignored."""
        if not self.ended.wait(timeout):
            raise subprocess.TimeoutExpired(_ZYGOTE, timeout)
        texts = []
        for path in (self._out, self._err):
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts.append(handle.read())
            os.unlink(path)
        if self.returncode is None:  # the warm interpreter stopped
            texts[1] += "\nthe warm interpreter that forked this process stopped"
            self.returncode = -1
        return tuple(texts)


class _Zygote:
    """A running warm interpreter and the calls it has forked."""

    def __init__(self, env):
        self._process = subprocess.Popen([sys.executable, _ZYGOTE], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         env=env, text=True, bufsize=1)
        self._lock = threading.Lock()
        self._calls = {}
        self._next_id = 0
        self._ready = threading.Event()
        self.alive = True
        threading.Thread(target=self._read, name="memgrad-warm-reader", daemon=True).start()

    def _read(self):
        for line in self._process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("ready"):
                self._ready.set()
                continue
            call = self._calls.get(message.get("id"))
            if call is None:
                continue
            if "pid" in message:
                call.pid = message["pid"]
                call.started.set()
            elif "exit" in message:
                self._calls.pop(message["id"], None)
                call._ended(message["exit"])
        self.alive = False
        self._ready.set()
        for call in list(self._calls.values()):
            call._ended(None)

    def spawn(self, request, env, cwd):
        """Forks a child for ``request`` (a `_fresh_worker` request); None if this warm
        interpreter could not start."""
        if not self._ready.wait(START_TIMEOUT_S) or not self.alive:
            return None
        out = tempfile.NamedTemporaryFile(prefix="memgrad-warm-", suffix=".out", delete=False)
        err = tempfile.NamedTemporaryFile(prefix="memgrad-warm-", suffix=".err", delete=False)
        out.close()
        err.close()
        with self._lock:
            self._next_id += 1
            call = _WarmChild(self._next_id, out.name, err.name)
            self._calls[call._id] = call
            line = json.dumps({"id": call._id, "request": request, "env": env,
                               "cwd": os.path.abspath(cwd) if cwd else os.getcwd(),
                               "out": out.name, "err": err.name})
            try:
                self._process.stdin.write(line + "\n")
                self._process.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._calls.pop(call._id, None)
                for path in (out.name, err.name):
                    os.unlink(path)
                return None
        call.started.wait(START_TIMEOUT_S)
        return call

    def close(self):
        try:
            self._process.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()


_zygotes = {}
_zygotes_lock = threading.Lock()


def spawn(request, env, cwd=None):
    """Runs ``request`` in a child of the warm interpreter for ``env``'s import-time variables
    (started on first use). Returns a `_WarmChild`, or None where no warm interpreter runs (the
    caller then starts a cold process)."""
    key = (sys.executable, _import_time_key(env))
    with _zygotes_lock:
        zygote = _zygotes.get(key)
        if zygote is None or not zygote.alive:
            zygote = _zygotes[key] = _Zygote(env)
    return zygote.spawn(request, env, cwd)


@atexit.register
def close_all():
    """Stops every warm interpreter this process started (their children are killed)."""
    with _zygotes_lock:
        zygotes = list(_zygotes.values())
        _zygotes.clear()
    for zygote in zygotes:
        zygote.close()
