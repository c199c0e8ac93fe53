"""A warm interpreter for fresh processes (`memgrad._src.profiler.fresh`, ``warm=True``): run as
a script, it imports TensorFlow and Keras once, runs no op (so no device, allocator or thread
pool exists yet), then forks one child per call. A child starts where a fresh process would
be after ``import tensorflow``, in a few hundred milliseconds instead of seconds of import.

Protocol, one JSON object per line. On stdout: ``{"ready": true}`` once imported, then
``{"id": n, "pid": p}`` when call ``n`` has forked and ``{"id": n, "exit": code}`` when it
ended (negative: the signal that ended it). On stdin, one call per line: ``{"id", "request"
(as `_fresh_worker.run` reads it), "env" (the child's whole environment), "cwd", "out",
"err" (files for the child's stdout and stderr)}``. At end of input it kills the children
still running and exits.

The child sets its environment and ``sys.path`` (from ``PYTHONPATH``) before the target's
module is imported, so a variable TensorFlow reads when it starts its devices or allocator
(``TF_CPU_ALLOCATOR_USE_BFC``, ``TF_CPU_BFC_MEM_LIMIT_IN_MB``, ``TF_NUM_INTEROP_THREADS``) takes
effect as in a fresh process. Variables read at TensorFlow's import are the interpreter's own:
the client keeps one warm interpreter per set of them (`warm._import_time_key`).
"""

import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    del sys.path[0]


def _load_worker():
    """`_fresh_worker` loaded from its file, so that memgrad's package is not imported before
    the target's module (as in a cold fresh process)."""
    spec = importlib.util.spec_from_file_location("_memgrad_fresh_worker", os.path.join(_HERE, "_fresh_worker.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(call, worker, base_path):
    """In the forked child: never returns."""
    code = 0
    try:
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, call["out"], os.O_WRONLY),
                                (2, call["err"], os.O_WRONLY)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(call["env"])
        if call.get("cwd"):
            os.chdir(call["cwd"])
        first = [p for p in call["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = list(dict.fromkeys(first + base_path))
        sys.argv[:] = [os.path.join(_HERE, "_fresh_worker.py")]
        worker.run(call["request"])
    except BaseException:  # noqa: BLE001 - reported on the child's stderr, as a crash would be
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _reap(children):
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        call_id = children.pop(pid, None)
        if call_id is not None:
            _send({"id": call_id, "exit": os.waitstatus_to_exitcode(status)})


def _default_path():
    """The ``sys.path`` this interpreter has without ``PYTHONPATH`` (site-packages and what
    their .pth files add), as a cold process has it after its ``PYTHONPATH`` entries."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
                           env=env, capture_output=True, text=True, check=True, cwd=_HERE)
    return [p for p in json.loads(found.stdout.strip().splitlines()[-1]) if p]


def main():
    base_path = _default_path()
    import tensorflow  # noqa: F401 - the import every child would otherwise pay
    import keras  # noqa: F401

    worker = _load_worker()
    _send({"ready": True})
    children, pending = {}, b""
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.05)
        _reap(children)
        if not readable:
            continue
        data = os.read(stdin, 1 << 16)
        if not data:
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            call = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(call, worker, base_path)
            children[pid] = call["id"]
            _send({"id": call["id"], "pid": pid})
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


if __name__ == "__main__":
    main()
