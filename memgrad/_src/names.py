"""Which layer made an op: its name scope, read from the op's name (shared by the profiler's
reports and `memgrad.analyze`)."""

import tensorflow as tf


def _op_names():
    return {name for name in dir(tf.raw_ops) if not name.startswith("_")}


_OP_NAMES = None
BACKWARD_SCOPES = ("gradient_tape", "gradients", "memgrad_grad")  # tf.GradientTape, tf.gradients, memgrad


def layer_of(op: str) -> str:
    """The layer (name scope) an op belongs to: its leading scope components before the first
    one named after an op type, with the gradient scope removed.

    Example:
      >>> layer_of("gradient_tape/sequential/dense_1/MatMul/MatMul_1")
      'sequential/dense_1'
      >>> layer_of("Add")
      ''
    """
    global _OP_NAMES
    if _OP_NAMES is None:
        _OP_NAMES = _op_names()
    parts = [p for p in str(op).split("/") if p]
    if parts and parts[0] in BACKWARD_SCOPES:
        parts = parts[1:]
    scope = []
    for part in parts:
        base = part.rsplit("_", 1)[0] if part.rsplit("_", 1)[-1].isdigit() else part
        if part in _OP_NAMES or base in _OP_NAMES:
            break
        scope.append(part)
    if len(scope) == len(parts) and scope:  # the last component is the op's own name
        scope = scope[:-1]
    return "/".join(scope)
