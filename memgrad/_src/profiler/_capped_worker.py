"""What `run_capped` runs in its fresh process (the allocator cap is already in the environment)."""

import importlib


def call_capped(target, kwargs):
    """Calls ``target(**kwargs)``; returns ``{"status": "ok", "peak_bytes": ...}`` or, if it ran
    out of memory, ``{"status": "oom", "message": ...}``. Other failures propagate."""
    module_name, function_name = target.split(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot import {target}: {error}") from None

    import tensorflow as tf  # after the environment is set by the parent

    try:
        function(**kwargs)
    except tf.errors.ResourceExhaustedError as error:
        return {"status": "oom", "message": str(error).strip().splitlines()[0][:500]}
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return {"status": "ok", "peak_bytes": int(peak)}

