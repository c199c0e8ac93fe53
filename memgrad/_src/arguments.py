"""How memgrad's entry points read example arguments (``args=``, ``kwargs=``). Imports nothing of memgrad."""

import numpy as np
import tensorflow as tf


def positional_args(args) -> tuple:
    """The positional arguments ``args`` stands for, as a tuple.

    A tuple or list holds the arguments; a single tensor or NumPy array is one
    argument (it is iterable too, so ``fn(*tensor)`` would pass its rows instead).

    Raises:
      TypeError: for anything else, e.g. ``None``, a number, a string or a dict.
    """
    if tf.is_tensor(args) or isinstance(args, np.ndarray):
        return (args,)
    if isinstance(args, (tuple, list)):
        return tuple(args)
    raise TypeError(
        "Expected args to be a tuple or list of positional arguments, or a single tensor or NumPy "
        f"array (passed as the one argument). Received: {args!r}"
    )
