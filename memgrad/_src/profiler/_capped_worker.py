"""What `run_capped` runs in its fresh process (the allocator cap is already in the environment)."""


def call_capped(target, kwargs, explain=False, k=10):
    """Calls ``target(**kwargs)``; returns ``{"status": "ok", "peak_bytes": ...}`` or, if it ran
    out of memory, ``{"status": "oom", "message": ...}``, with ``"report"`` (an
    `OutOfMemoryReport` as a dict: what was alive at the failure) when ``explain`` is set.
    Other failures propagate."""
    from memgrad._src.profiler.fresh import load_target  # standard library only: no TensorFlow yet

    function = load_target(target)

    import tensorflow as tf  # after the environment is set by the parent

    try:
        function(**kwargs)
    except tf.errors.ResourceExhaustedError as error:
        from memgrad._src.profiler.oom import first_line

        result = {"status": "oom", "message": first_line(error)}
    else:
        # The peak since the process started (not a MemoryWindow: reading the statistics
        # before the call would start TensorFlow's runtime before the target configures it).
        from memgrad._src.allocator import statistics

        return {"status": "ok", "peak_bytes": int(statistics("CPU:0")["peak"])}
    if explain:  # once more, under the profiler, with the failed call's buffers released
        import gc

        from memgrad._src.profiler.oom import oom_report

        gc.collect()
        report = oom_report(function, kwargs=kwargs, k=k, device="CPU:0")
        result["report"] = None if report is None else report.as_dict()
    return result
