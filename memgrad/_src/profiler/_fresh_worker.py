"""Entry point of a fresh process (`memgrad._src.profiler.fresh`), run as a script so that nothing
is imported before the target's module (not even memgrad): reads the call from stdin, prints the
marker and ``{json}`` with its status and value on stdout."""

import importlib
import json
import os
import sys
import traceback

# Run as a script, Python puts this file's folder first on sys.path: its module names
# (measure, report, ...) would shadow top-level ones.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]


def main() -> None:
    run(json.loads(sys.stdin.read()))


def run(request) -> None:
    """Calls ``request``'s target and prints the marker and the outcome (also in a process
    forked from a warm interpreter: `memgrad._src.profiler._fresh_zygote`)."""
    marker = request["marker"]

    def report(text):
        # A newline first: the target may have left a line unfinished.
        sys.stdout.write("\n" + marker + text + "\n")
        sys.stdout.flush()

    module_name, function_name = request["target"].split(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        report(json.dumps({"status": "error", "message": f"cannot import {request['target']}: {error}"}))
        return
    try:
        value = json.dumps(function(*request["args"], **request["kwargs"]))
    except Exception as error:  # reported to the parent, which raises FreshProcessError
        message = "".join(traceback.format_exception(error))[-3000:].strip()
        report(json.dumps({"status": "error", "message": message}))
        return
    report('{"status": "ok", "value": ' + value + "}")


if __name__ == "__main__":
    main()
