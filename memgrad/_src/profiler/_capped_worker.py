"""Subprocess entry point of `run_capped`: the allocator cap is already in the environment."""

import importlib
import json
import sys
import traceback

from memgrad._src.profiler.emulated import RESULT_MARKER


def _report(**fields):
    print(RESULT_MARKER + json.dumps(fields), flush=True)


def main(payload: str) -> None:
    request = json.loads(payload)
    module_name, function_name = request["target"].split(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        _report(status="error", message=f"cannot import {request['target']}: {error}")
        return

    import tensorflow as tf  # after the environment is set by the parent

    try:
        function(**request["kwargs"])
    except tf.errors.ResourceExhaustedError as error:
        _report(status="oom", message=str(error).strip().splitlines()[0][:500])
        return
    except Exception as error:  # reported to the parent, which raises CappedRunError
        _report(status="error", message="".join(traceback.format_exception_only(error)).strip())
        return
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    _report(status="ok", peak_bytes=int(peak))


if __name__ == "__main__":
    main(sys.argv[1])
