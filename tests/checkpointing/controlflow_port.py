"""TensorFlow's own control-flow gradient tests, re-expressed, run through every memgrad entry.

Each case is a small forward computation re-written here, in this project's words, after a
test in TensorFlow's ``while_v2_test``, ``cond_v2_test``, ``control_flow_ops_py_test``,
``tensor_array_ops_test`` and ``functional_ops_test``, or Keras's recurrent layer tests: the
same control-flow construct and the same derivative order, not the same code. A case is a
function ``fn(G, *xs)`` returning a scalar; ``G(f, xs)`` is the gradient of ``f(*xs)`` with
respect to ``xs`` taken by the entry point under test, for cases that differentiate inside a
loop body or a branch. ``order`` > 1 differentiates the case's gradient again (its gradients,
weighted, summed), ``order - 1`` times, with the same entry point at every level.

`run_case` traces one `tf.function` per case holding TensorFlow's references and every
entry point (one trace, one run; an entry point whose trace raises is retried alone), with
or without XLA, and says per entry: ``exact``, ``fallback`` (plain TensorFlow with a warning,
and why), ``wrong``, ``none`` (None where TensorFlow gives a gradient), ``crash``, or
``unsupported`` (TensorFlow's own reference cannot build or compile it).

Used by tests/checkpointing/test_controlflow_port.py (no entry may be wrong, None or crash)
and scripts/controlflow_port.py (the table in docs/loops.md).
"""

import collections
import dataclasses
import re
import warnings

import keras
import numpy as np
import tensorflow as tf

import memgrad

RTOL = 1e-5
ENTRIES = ("memory", "speed", "collection", "budget", "tape", "monkey_patch")
ck = memgrad.mark_checkpoint  # marks a tensor for 'collection'; the other strategies ignore it


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    origin: str  # the test file the construct comes from
    fn: object
    inputs: tuple  # numpy arrays (passed as tensors) or tf.Variables (captured)
    order: int = 1


CASES = []


def _rng(seed):
    return np.random.default_rng(seed)


def _arr(*shape, seed=0, low=-1.0, high=1.0):
    return _rng(seed).uniform(low, high, size=shape).astype(np.float32)


def case(origin, name, *inputs, order=1):
    def register(fn):
        CASES.append(Case(f"{origin.split('_test')[0]}: {name}", origin, fn, tuple(inputs),
                          order))
        return fn
    return register


def _loop(n, body, *state):
    """``tf.while_loop`` over ``n`` (a Python int) steps of ``body(*state)``; returns the
    state, its floating tensors marked for 'collection'."""
    # maximum_iterations: XLA differentiates a while loop only with a static bound.
    out = tf.while_loop(lambda i, *s: i < n, lambda i, *s: (i + 1,) + tuple(body(*s)),
                        (tf.constant(0),) + tuple(state), maximum_iterations=n)
    out = [ck(t) if isinstance(t, tf.Tensor) and t.dtype.is_floating else t for t in out[1:]]
    return out if len(state) > 1 else out[0]


WHILE, COND, CF = "while_v2_test", "cond_v2_test", "control_flow_ops_py_test"
TA, FN, RNN = "tensor_array_ops_test", "functional_ops_test", "keras rnn tests"
_S = np.float32(1.3)
_VEC = _arr(4, seed=1)
_MAT = _arr(4, 4, seed=2) * 0.6
_VAR = tf.Variable(_arr(4, seed=3), name="port_v")
_TABLE = tf.Variable(_arr(6, 3, seed=4), name="port_table")
_W = tf.Variable(_arr(4, 4, seed=5) * 0.5, name="port_w")

# ------------------------------------------------------------------------ while_v2_test
@case(WHILE, "one loop variable squared until it passes 8", _S)
def _(G, x):
    return tf.while_loop(lambda v: v < 8.0, lambda v: (v * v,), (x,))[0]


@case(WHILE, "two loop variables feeding each other", _S, np.float32(0.7))
def _(G, x, y):
    a, b = _loop(3, lambda a, b: (a * b, a + b), x, y)
    return a + 2.0 * b


@case(WHILE, "loop variables that are vectors, a non-scalar body", _VEC)
def _(G, x):
    return tf.reduce_sum(_loop(4, lambda v: (tf.tanh(tf.linalg.matvec(_MAT, v)) + v,), x))


for _order in (2, 3, 4):
    @case(WHILE, f"derivative {_order} of v**2 through a two-step loop", _S, order=_order)
    def _(G, x):
        return _loop(2, lambda v: (v * v,), x)

    if _order < 4:  # a 4th derivative of these builds minutes of graph, in TensorFlow too
        @case(WHILE, f"derivative {_order} through two chained loops", _S, order=_order)
        def _(G, x):
            y = _loop(2, lambda v: (v * v,), x)
            return _loop(2, lambda v: (tf.sin(v) * v,), y)

        @case(WHILE, f"derivative {_order} through a loop nested in a loop", np.float32(0.9),
              order=_order)
        def _(G, x):
            return _loop(2, lambda v: (_loop(2, lambda u: (u * x + 0.1,), v) * v,), x)

    @case(WHILE, f"derivative {_order} through a loop writing a TensorList", np.float32(0.8),
          order=_order)
    def _(G, x):
        def body(v, ta):
            return tf.sin(v) + v, ta.write(ta.size(), v * v)
        v, ta = _loop(3, body, x, tf.TensorArray(tf.float32, size=0, dynamic_size=True))
        return tf.reduce_sum(ta.stack()) + v


@case(WHILE, "a loop reading a variable in its body", _VEC, _VAR)
def _(G, x, v):
    return tf.reduce_sum(_loop(3, lambda h: (tf.tanh(h * v) + h,), x) ** 2)


@case(WHILE, "a loop gathering rows of a variable (IndexedSlices)", _TABLE)
def _(G, table):
    def body(i, acc):
        return i + 1, acc + tf.gather(table, i % 6) * tf.cast(i + 1, tf.float32)
    return tf.reduce_sum(tf.while_loop(lambda i, a: i < 5, body, (0, tf.zeros([3])))[1] ** 2)


@case(WHILE, "a loop's gradient stopped and added back to the loss", _S, order=1)
def _(G, x):
    y = _loop(2, lambda v: (tf.sin(v) * v,), x)
    g = G(lambda x: _loop(2, lambda v: (tf.sin(v) * v,), x), [x])[0]
    return y + tf.stop_gradient(g) * x


@case(WHILE, "a loop's stopped gradient added back, second derivative", _S, order=2)
def _(G, x):
    y = _loop(2, lambda v: (tf.sin(v) * v,), x)
    g = G(lambda x: _loop(2, lambda v: (tf.sin(v) * v,), x), [x])[0]
    return y + tf.stop_gradient(g) * x * x


@case(WHILE, "a loop variable the output does not use", _S, np.float32(0.4))
def _(G, x, y):
    a, _b = _loop(3, lambda a, b: (a * 1.5 + 0.2, b * a), x, y)
    return a


@case(WHILE, "maximum_iterations below the condition's count", _S)
def _(G, x):
    return tf.while_loop(lambda v: v < 1e6, lambda v: (v * 1.7,), (x,), maximum_iterations=4)[0]


@case(WHILE, "a body capturing an outer tensor", _S, np.float32(0.6))
def _(G, x, y):
    return _loop(4, lambda v: (tf.cos(v * y) + x,), x)


@case(WHILE, "the trip count is data-dependent", np.float32(0.3))
def _(G, x):
    def body(i, v):
        return i + 1, v * 1.4 + tf.sin(v)
    i, v = tf.while_loop(lambda i, v: v < 3.0, body, (0, x))
    return v * tf.cast(i, tf.float32)


@case(WHILE, "a tf.cond inside the body", _VEC)
def _(G, x):
    def body(i, v):
        return i + 1, tf.cond(i % 2 == 0, lambda: tf.tanh(v) * 2.0, lambda: v * v)
    return tf.reduce_sum(tf.while_loop(lambda i, v: i < 4, body, (0, x))[1])


@case(WHILE, "a gradient inside the body with respect to an outer tensor", _VEC)
def _(G, x):
    w = x * 1.0

    def body(v):
        return (v - 0.1 * G(lambda w: tf.reduce_sum(tf.tanh(w * v) * w), [w])[0],)
    return tf.reduce_sum(_loop(3, body, x) ** 2)


@case(WHILE, "gradient descent inside the loop, differentiated (meta-learning)", _VEC)
def _(G, x):
    def body(v):
        return (v - 0.2 * G(lambda v: tf.reduce_sum(tf.sin(v * x) ** 2), [v])[0],)
    return tf.reduce_sum(_loop(3, body, x * 0.5) ** 2)


@case(WHILE, "a gradient inside the body with respect to a variable read there", _VEC, _VAR)
def _(G, x, var):
    def body(v):
        return (v + 0.1 * G(lambda w: tf.reduce_sum(tf.tanh(w * v) ** 2), [var])[0],)
    return tf.reduce_sum(_loop(2, body, x) * x)


@case(WHILE, "parallel_iterations=1", _VEC)
def _(G, x):
    return tf.reduce_sum(tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.sin(v) * x),
                                       (0, x), parallel_iterations=1)[1])


@case(WHILE, "a growing state under shape_invariants", _VEC)
def _(G, x):
    def body(i, v):
        return i + 1, tf.concat([v, tf.tanh(v[-4:]) * x], 0)
    out = tf.while_loop(lambda i, v: i < 3, body, (0, x),
                        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None])))[1]
    return tf.reduce_sum(out ** 2)


@case(WHILE, "only one of three loop outputs used", _S)
def _(G, x):
    a, b, c = _loop(3, lambda a, b, c: (a + b, b * c, c * 0.9 + a), x, x * 2.0, x * 3.0)
    return b


@case(WHILE, "an element of a TensorArray the loop wrote", _VEC)
def _(G, x):
    def body(v, ta):
        v = tf.tanh(v) + x
        return v, ta.write(ta.size(), v)
    _v, ta = _loop(4, body, x, tf.TensorArray(tf.float32, size=0, dynamic_size=True))
    return tf.reduce_sum(ta.read(2) ** 2)


# ------------------------------------------------------------------------ cond_v2_test
@case(COND, "x*2 or y*3, the true branch taken", _S, np.float32(0.5))
def _(G, x, y):
    return tf.cond(tf.constant(True), lambda: x * 2.0, lambda: y * 3.0)


@case(COND, "x*2 or y*3, the false branch taken", _S, np.float32(0.5))
def _(G, x, y):
    return tf.cond(x > 5.0, lambda: x * 2.0, lambda: y * 3.0 * x)


@case(COND, "a predicate computed from x", _VEC)
def _(G, x):
    return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.reduce_sum(tf.sin(x)),
                   lambda: tf.reduce_sum(tf.cos(x)))


for _order in (2, 3, 4):
    @case(COND, f"derivative {_order} of cos through tf.cond", _S, order=_order)
    def _(G, x):
        return tf.cond(x > 0, lambda: tf.cos(x), lambda: tf.sin(x))

    @case(COND, f"derivative {_order} of cos through tf.switch_case", _S, order=_order)
    def _(G, x):
        return tf.switch_case(tf.constant(1), [lambda: tf.sin(x), lambda: tf.cos(x),
                                               lambda: x * x])


@case(COND, "a cond nested in a cond", _S, np.float32(0.5))
def _(G, x, y):
    return tf.cond(x > 0, lambda: tf.cond(y > 0, lambda: x * y, lambda: x), lambda: y)


@case(COND, "a cond nested three deep", _S)
def _(G, x):
    def nest(k, v):
        if k == 0:
            return tf.sin(v)
        return tf.cond(v > -5.0, lambda: nest(k - 1, v * 1.1), lambda: v)
    return nest(3, x)


@case(COND, "a branch reading a variable", _VEC, _VAR)
def _(G, x, v):
    return tf.cond(tf.reduce_sum(x) < 10.0, lambda: tf.reduce_sum(tf.tanh(x * v)),
                   lambda: tf.reduce_sum(x))


@case(COND, "a gradient inside a branch with respect to an outer tensor", _VEC)
def _(G, x):
    w = x * 1.0
    g = tf.cond(tf.reduce_sum(x) < 10.0,
                lambda: G(lambda w: tf.reduce_sum(tf.sin(w) * w), [w])[0], lambda: x)
    return tf.reduce_sum(g * x)


@case(COND, "switch_case with a variable in a branch", _VEC, _VAR)
def _(G, x, v):
    return tf.switch_case(tf.constant(2), [lambda: tf.reduce_sum(x), lambda: tf.reduce_sum(v),
                                           lambda: tf.reduce_sum(tf.sin(x * v) * v)])


@case(COND, "switch_case whose index is data-dependent", _VEC)
def _(G, x):
    index = tf.cast(tf.reduce_sum(tf.abs(x)) * 10.0, tf.int32) % 3
    return tf.switch_case(index, [lambda: tf.reduce_sum(x * x), lambda: tf.reduce_sum(tf.sin(x)),
                                  lambda: tf.reduce_prod(x)])


@case(COND, "a loop inside a branch, second derivative", np.float32(0.7), order=2)
def _(G, x):
    return tf.cond(x > 0, lambda: _loop(3, lambda v: (tf.sin(v) * x,), x), lambda: x)


@case(COND, "a branch returning a constant", _S)
def _(G, x):
    return tf.cond(x > 100.0, lambda: tf.constant(3.0), lambda: x * x) + x


@case(COND, "a cond with two outputs", _S, np.float32(0.5))
def _(G, x, y):
    a, b = tf.cond(x > 0, lambda: (x * y, x + y), lambda: (y, x))
    return a * b


@case(COND, "a cond in a nested tf.function", _VEC)
def _(G, x):
    @tf.function
    def inner(v):
        return tf.cond(tf.reduce_sum(v) > -10.0, lambda: tf.tanh(v) * v, lambda: v)
    return tf.reduce_sum(inner(x) ** 2)


@case(COND, "a branch gathering from a variable (IndexedSlices)", _TABLE)
def _(G, table):
    return tf.cond(tf.constant(True), lambda: tf.reduce_sum(tf.gather(table, [0, 2, 2]) ** 2),
                   lambda: tf.reduce_sum(table))


@case(COND, "a branch with an assert (a stateful If)", _VEC)
def _(G, x):
    def branch():
        with tf.control_dependencies([tf.debugging.assert_all_finite(x, "finite")]):
            return tf.reduce_sum(tf.exp(x))
    return tf.cond(tf.reduce_sum(x) < 10.0, branch, lambda: tf.reduce_sum(x))


@case(COND, "cond of a checkpointed input, second derivative", _VEC, order=2)
def _(G, x):
    h = ck(tf.tanh(x) * x)
    return tf.cond(tf.reduce_sum(h) > -10.0, lambda: tf.reduce_sum(tf.sin(h) * h),
                   lambda: tf.reduce_sum(h))


# ------------------------------------------------------------- control_flow_ops_py_test
@case(CF, "while: square twice", _S)
def _(G, x):
    return _loop(2, lambda v: (tf.square(v),), x)


@case(CF, "while: a body using tf.shape", _VEC)
def _(G, x):
    return tf.reduce_sum(_loop(3, lambda v: (v * tf.cast(tf.shape(v)[0], tf.float32) * 0.3,), x))


@case(CF, "while: two variables multiplied", _S, np.float32(0.9))
def _(G, x, y):
    return _loop(3, lambda v: (v * y,), x)


@case(CF, "while inside a cond", _S)
def _(G, x):
    return tf.cond(x > 0, lambda: _loop(3, lambda v: (v * v * 0.5,), x), lambda: x)


@case(CF, "while inside a while", _S)
def _(G, x):
    return _loop(2, lambda v: (_loop(2, lambda u: (u * 0.9 + tf.sin(u),), v),), x)


@case(CF, "nested while: two inner loops in sequence", _S)
def _(G, x):
    def body(v):
        v = _loop(2, lambda u: (u * 1.1,), v)
        return (_loop(2, lambda u: (tf.sin(u) + u,), v),)
    return _loop(2, body, x)


@case(CF, "nested while: two inner loops side by side", _S)
def _(G, x):
    def body(v):
        return (_loop(2, lambda u: (u * 1.1,), v) + _loop(3, lambda u: (tf.cos(u),), v),)
    return _loop(2, body, x)


@case(CF, "while: a cond in the body", _S)
def _(G, x):
    return _loop(3, lambda v: (tf.cond(v > 1.0, lambda: v * 0.5, lambda: v * 2.0),), x)


@case(CF, "while: stop_gradient on one loop variable", _S, np.float32(0.4))
def _(G, x, y):
    a, b = _loop(3, lambda a, b: (a * b + 0.1, tf.stop_gradient(b) * 1.1), x, y)
    return a + b


@case(CF, "while: stop_gradient inside the body", _S)
def _(G, x):
    return _loop(3, lambda v: (tf.stop_gradient(v) * v + 0.1,), x)


@case(CF, "while: stop_gradient on a non-scalar state", _VEC)
def _(G, x):
    return tf.reduce_sum(_loop(3, lambda v: (tf.stop_gradient(tf.tanh(v)) * v * x,), x))


@case(CF, "while: gradient of a gradient", _S, order=2)
def _(G, x):
    return _loop(3, lambda v: (v * x,), x)


@case(CF, "while: one output with a control dependency on the other", _S)
def _(G, x):
    def body(a, b):
        b = b + 1.0
        with tf.control_dependencies([b]):
            a = a * 1.2
        return a, b
    a, _b = _loop(3, body, x, x)
    return a


@case(CF, "cond: gradient of the taken branch (1)", _S)
def _(G, x):
    return tf.cond(x < 10.0, lambda: x * 42.0, lambda: x)


@case(CF, "cond: both branches use the input (2)", _S, np.float32(2.0))
def _(G, x, y):
    return tf.cond(x < y, lambda: x * y, lambda: x + y)


@case(CF, "cond: a branch calling a nested function (3)", _S)
def _(G, x):
    @tf.function
    def fn(v):
        return v * v * 3.0
    return tf.cond(x < 10.0, lambda: fn(x), lambda: x)


@case(CF, "cond: a branch gathering rows", _arr(5, 3, seed=7))
def _(G, x):
    return tf.reduce_sum(tf.cond(tf.constant(True), lambda: tf.gather(x, [1, 3]),
                                 lambda: tf.gather(x, [0, 0])) ** 2)


@case(CF, "cond inside two nested whiles", _S)
def _(G, x):
    def inner(u):
        return (tf.cond(u > 0, lambda: u * 0.9, lambda: -u),)
    return _loop(2, lambda v: (_loop(2, inner, v) + 0.1,), x)


@case(CF, "while: IndexedSlices from gathering the loop's input", _arr(6, 3, seed=8))
def _(G, x):
    def body(i, acc):
        return i + 1, acc + tf.gather(x, i) ** 2
    return tf.reduce_sum(tf.while_loop(lambda i, a: i < 4, body, (0, tf.zeros([3])))[1])


@case(CF, "while: calling a nested tf.function in the body", _S)
def _(G, x):
    @tf.function
    def step(v):
        return tf.sin(v) * 2.0
    return _loop(3, lambda v: (step(v),), x)


@case(CF, "while: a body calling a function that loops", _S)
def _(G, x):
    @tf.function
    def inner(v):
        return _loop(2, lambda u: (u * 0.7 + tf.cos(u),), v)
    return _loop(2, lambda v: (inner(v),), x)


@case(CF, "while: a body using a variable and a tensor", _VEC, _VAR)
def _(G, x, v):
    return tf.reduce_sum(_loop(3, lambda h: (h * v + x,), x))


@case(CF, "while: the loop's output read twice", _S)
def _(G, x):
    y = _loop(3, lambda v: (tf.sin(v) + v,), x)
    return y * y + y


@case(CF, "while: a loop with no dependence on x (unconnected)", _S)
def _(G, x):
    return _loop(3, lambda v: (v * 2.0,), tf.constant(1.0)) + x


@case(CF, "while: integer and float loop variables", _S)
def _(G, x):
    def body(i, k, v):
        return i + 1, k * 2, v * tf.cast(k, tf.float32) * 0.5
    return tf.while_loop(lambda i, k, v: i < 3, body, (0, 1, x))[2]


@case(CF, "while: a matmul chain (an RNN by hand)", _arr(2, 4, seed=9), _W)
def _(G, x, w):
    return tf.reduce_sum(_loop(5, lambda h: (tf.tanh(h @ w + x),), x) ** 2)


@case(CF, "while: a matmul chain, second derivative", _arr(2, 4, seed=9), order=2)
def _(G, x):
    return tf.reduce_sum(_loop(4, lambda h: (tf.tanh(h @ _MAT + x),), x) ** 2)


@case(CF, "while: checkpointed loop output, second derivative", _S, order=2)
def _(G, x):
    y = ck(_loop(3, lambda v: (v * v * 0.5 + 0.1,), x))
    return tf.sin(y) * y


@case(CF, "while: checkpointed loop output, third derivative", _S, order=3)
def _(G, x):
    return ck(_loop(2, lambda v: (v * v,), x)) * x


@case(CF, "while: checkpointed loop output, fourth derivative", np.float32(0.9), order=4)
def _(G, x):
    return ck(_loop(2, lambda v: (tf.sin(v) * v,), x))


# ------------------------------------------------------------------- tensor_array_ops_test
def _ta(n=0, dynamic=True, **kw):
    return tf.TensorArray(tf.float32, size=n, dynamic_size=dynamic, **kw)


@case(TA, "write then read", _VEC)
def _(G, x):
    ta = _ta(2, False).write(0, x * 2.0).write(1, tf.sin(x))
    return tf.reduce_sum(ta.read(0) * ta.read(1))


@case(TA, "write, stack, and read", _VEC)
def _(G, x):
    ta = _ta(3, False).write(0, x).write(1, x * x).write(2, tf.cos(x))
    return tf.reduce_sum(ta.stack() ** 2) + tf.reduce_sum(ta.read(1))


@case(TA, "unstack then read", _arr(3, 4, seed=10))
def _(G, x):
    ta = _ta(3, False).unstack(x)
    return tf.reduce_sum(ta.read(0) * ta.read(2))


@case(TA, "split then concat", _arr(6, seed=11))
def _(G, x):
    ta = _ta(3, False, infer_shape=False).split(x * 1.5, lengths=[1, 2, 3])
    return tf.reduce_sum(ta.concat() ** 2)


@case(TA, "scatter then gather", _arr(4, 3, seed=12))
def _(G, x):
    ta = _ta(5, False).scatter([0, 2, 3, 4], x)
    return tf.reduce_sum(ta.gather([2, 4]) ** 2)


@case(TA, "only some elements read", _VEC)
def _(G, x):
    ta = _ta(3, False).write(0, x).write(1, x * 3.0).write(2, x * 5.0)
    return tf.reduce_sum(ta.read(1))


@case(TA, "the same element read twice", _VEC)
def _(G, x):
    ta = _ta(1, False).write(0, tf.sin(x))
    return tf.reduce_sum(ta.read(0) * ta.read(0))


@case(TA, "a while loop writing every step", _VEC)
def _(G, x):
    def body(i, v, ta):
        v = tf.tanh(v * 1.3)
        return i + 1, v, ta.write(i, v)
    _, _, ta = tf.while_loop(lambda i, v, ta: i < 5, body, (0, x, _ta(5, False)))
    return tf.reduce_sum(ta.stack() ** 2)


@case(TA, "a while loop reading an unstacked array", _arr(5, 4, seed=13))
def _(G, x):
    ta = _ta(5, False).unstack(x)

    def body(i, h):
        return i + 1, tf.tanh(h + ta.read(i))
    return tf.reduce_sum(tf.while_loop(lambda i, h: i < 5, body, (0, tf.zeros([4])))[1])


@case(TA, "a dynamically sized array in a loop, second derivative", _S, order=2)
def _(G, x):
    def body(i, v, ta):
        return i + 1, v * 0.8 + 0.1, ta.write(i, v * v)
    _, _, ta = tf.while_loop(lambda i, v, ta: i < 3, body, (0, x, _ta()))
    return tf.reduce_sum(ta.stack())


@case(TA, "gradients through two arrays, in order", _VEC, _arr(4, seed=14))
def _(G, x, y):
    a = _ta(2, False).write(0, x).write(1, y)
    b = _ta(2, False).write(0, a.read(1) * x).write(1, a.read(0) * y)
    return tf.reduce_sum(b.stack() ** 2)


@case(TA, "a loop over an array read with clear_after_read=False", _VEC)
def _(G, x):
    ta = _ta(1, False, clear_after_read=False).write(0, x)

    def body(i, acc):
        return i + 1, acc + ta.read(0) * tf.cast(i, tf.float32)
    return tf.reduce_sum(tf.while_loop(lambda i, a: i < 3, body, (0, tf.zeros([4])))[1] ** 2)


# ---------------------------------------------------------------------- functional_ops_test
@case(FN, "scan", _VEC)
def _(G, x):
    return tf.reduce_sum(tf.scan(lambda a, e: a * e + tf.sin(a), x * 0.5, initializer=x[0]))


@case(FN, "scan with part of the elements stopped", _VEC)
def _(G, x):
    return tf.reduce_sum(tf.scan(lambda a, e: a * tf.stop_gradient(e) + e, x, initializer=1.0))


@case(FN, "foldl", _VEC)
def _(G, x):
    return tf.foldl(lambda a, e: a * e + 1.0, x, initializer=tf.constant(0.5))


@case(FN, "foldr", _VEC)
def _(G, x):
    return tf.foldr(lambda a, e: tf.sin(a) * e, x, initializer=tf.constant(0.5))


@case(FN, "map_fn", _arr(3, 4, seed=15))
def _(G, x):
    return tf.reduce_sum(tf.map_fn(lambda r: tf.reduce_sum(tf.tanh(r) * r), x))


@case(FN, "scan of a scan", _arr(3, 2, seed=16))
def _(G, x):
    def outer(a, row):
        return tf.scan(lambda b, e: b * 0.5 + e * a[0], row, initializer=a[0])
    return tf.reduce_sum(tf.scan(outer, x, initializer=tf.zeros([2])) ** 2)


@case(FN, "scan over two inputs to one output", _VEC, _arr(4, seed=17))
def _(G, x, y):
    return tf.reduce_sum(tf.scan(lambda a, e: a + e[0] * e[1], (x, y), initializer=0.0))


@case(FN, "scan in reverse", _VEC)
def _(G, x):
    return tf.reduce_sum(tf.scan(lambda a, e: tf.cos(a) + e, x, reverse=True) ** 2)


@case(FN, "scan, second derivative", _VEC, order=2)
def _(G, x):
    return tf.reduce_sum(tf.scan(lambda a, e: tf.sin(a) * e, x, initializer=0.5))


@case(FN, "map_fn, second derivative", _arr(3, 4, seed=18), order=2)
def _(G, x):
    return tf.reduce_sum(tf.map_fn(lambda r: tf.sin(r) * r, x))


@case(FN, "foldl over a variable", _VAR)
def _(G, v):
    return tf.foldl(lambda a, e: a * e + tf.reduce_sum(v) * 0.1, tf.sin(v) + 1.0,
                    initializer=tf.constant(1.0))


@case(FN, "scan with a checkpointed output, third derivative", _VEC, order=3)
def _(G, x):
    return tf.reduce_sum(ck(tf.scan(lambda a, e: a * e, x, initializer=1.0)))


# ------------------------------------------------------------------------ Keras RNN tests
_T, _B, _F, _U = 5, 2, 3, 4
_SEQ = _arr(_B, _T, _F, seed=20)


def _rnn(layer):
    layer.build((_B, _T, _F))
    return layer


keras.utils.set_random_seed(0)
_RNNS = {
    "SimpleRNN": _rnn(keras.layers.SimpleRNN(_U)),
    "GRU": _rnn(keras.layers.GRU(_U)),
    "GRU without reset_after": _rnn(keras.layers.GRU(_U, reset_after=False)),
    "LSTM": _rnn(keras.layers.LSTM(_U)),
    "LSTM returning sequences": _rnn(keras.layers.LSTM(_U, return_sequences=True)),
    "LSTM going backwards": _rnn(keras.layers.LSTM(_U, go_backwards=True)),
    "LSTM unrolled": _rnn(keras.layers.LSTM(_U, unroll=True)),
    "Bidirectional GRU": _rnn(keras.layers.Bidirectional(keras.layers.GRU(_U))),
    "RNN of stacked cells": _rnn(keras.layers.RNN(
        [keras.layers.LSTMCell(_U), keras.layers.GRUCell(_U)])),
    "SimpleRNN returning its state": _rnn(keras.layers.SimpleRNN(_U, return_state=True)),
}


def _rnn_case(name, layer):
    @case(RNN, name + ", input and weights", _SEQ, *layer.trainable_variables)
    def _(G, x, *weights):
        out = layer(x)
        out = out if isinstance(out, (list, tuple)) else [out]
        return tf.add_n([tf.reduce_sum(o ** 2) for o in out])


for _name, _layer in _RNNS.items():
    _rnn_case(_name, _layer)


@case(RNN, "LSTM with a mask", _SEQ)
def _(G, x):
    mask = tf.constant([[True] * _T, [True] * 3 + [False] * (_T - 3)])
    return tf.reduce_sum(_RNNS["LSTM"](x, mask=mask) ** 2)


@case(RNN, "GRU with an initial state", _SEQ, _arr(_B, _U, seed=21))
def _(G, x, h0):
    return tf.reduce_sum(_RNNS["GRU"](x, initial_state=[h0]) ** 2)


@case(RNN, "LSTM, Hessian-vector product with the input", _SEQ, order=2)
def _(G, x):
    return tf.reduce_sum(_RNNS["LSTM"](x) ** 2)


@case(RNN, "GRU, Hessian-vector product with the input", _SEQ, order=2)
def _(G, x):
    return tf.reduce_sum(_RNNS["GRU"](x) ** 2)


@case(RNN, "SimpleRNN, gradient penalty on the input", _SEQ)
def _(G, x):
    g = G(lambda x: tf.reduce_sum(_RNNS["SimpleRNN"](x)), [x])[0]
    return tf.reduce_sum(_RNNS["SimpleRNN"](x) ** 2) + tf.reduce_sum(g ** 2)


# --------------------------------------------------------------------------- the runner
def _weights(g):
    """Fixed, uneven weights for contracting a gradient to a scalar."""
    n = int(np.prod(g.shape)) if g.shape.is_fully_defined() else None
    if n is None:
        return tf.ones_like(g)
    return tf.reshape(tf.constant(np.linspace(0.5, 1.5, n), g.dtype), g.shape)


def _contract(grads, xs):
    parts = []
    for g in grads:
        if g is None:
            continue
        g = tf.convert_to_tensor(g)
        parts.append(tf.reduce_sum(g * _weights(g)))
    if not parts:  # no gradient at all: a zero that still depends on xs
        return tf.add_n([tf.reduce_sum(tf.convert_to_tensor(x)) * 0.0 for x in xs])
    return tf.add_n(parts)


def _by_gradients(fn):
    def G(f, xs):
        return fn(f(*xs), xs)
    return G


def _by_tape(tape_class, **kwargs):
    def G(f, xs):
        with tape_class(persistent=False, **kwargs) as tape:
            for x in xs:
                if isinstance(x, tf.Tensor):
                    tape.watch(x)
            y = f(*xs)
        return tape.gradient(y, xs)
    return G


def _plain(y, xs):
    return tf.gradients(y, xs)


def _budget_gradients(y, xs):
    """A Budget of 70% of plain backprop's peak; where no plan fits that (these graphs are
    tiny), the smallest budget the refusal names. A budget named from the memory model can
    be refused again once simulated (naming a larger one): up to three refusals are
    followed."""
    budget = memgrad.strategies.Budget(0.7)
    for _ in range(3):
        try:
            return memgrad.gradients(y, xs, checkpoints=budget)
        except memgrad.BudgetError as error:
            budget = memgrad.strategies.Budget(error.smallest_feasible_bytes)
    return memgrad.gradients(y, xs, checkpoints=budget)


def _derivative(G, fn, xs, order):
    """The ``order``-th derivative, by G at every level, of ``fn(G, *xs)``."""
    f = lambda *v: fn(G, *v)  # noqa: E731
    for _ in range(order - 1):
        f = (lambda inner: lambda *v: _contract(G(inner, list(v)), v))(f)
    return G(f, list(xs))


def _entry_gradient(entry):
    if entry in ("memory", "speed", "collection"):
        return _by_gradients(lambda y, xs: memgrad.gradients(y, xs, checkpoints=entry))
    if entry == "budget":
        return _by_gradients(_budget_gradients)
    if entry == "tape":
        return _by_tape(memgrad.GradientTape, checkpoints="memory")
    if entry == "monkey_patch":
        return _by_gradients(lambda y, xs: tf.gradients(y, xs))
    raise ValueError(entry)


Outcome = collections.namedtuple("Outcome", "status detail")


def _relative_error(got, expected):
    got = tf.convert_to_tensor(got).numpy()
    expected = tf.convert_to_tensor(expected).numpy()
    scale = max(float(np.abs(expected).max()) if expected.size else 0.0, 1e-6)
    return float(np.abs(got - expected).max()) / scale if expected.size else 0.0


def _compare(got, expected):
    for g, e in zip(got, expected):
        if e is None and g is None:
            continue
        if g is None:
            return Outcome("none", "None where TensorFlow gives a gradient")
        if e is None:
            return Outcome("wrong", "a gradient where TensorFlow gives None")
        error = _relative_error(g, e)
        if not error <= RTOL:
            return Outcome("wrong", f"relative error {error:.2g}")
    return None


def _reason(messages):
    """A fallback's reason, without the variable part (names, indices)."""
    text = messages[0]
    text = re.sub(r"^.*cannot rewrite this graph: ", "", text)
    text = re.sub(r"\. Using .*$", "", text)
    text = re.sub(r"'[^']*'", "'...'", text)
    text = re.sub(r"\[\d+\]", "[i]", text)
    return text


def _run(case_, entries, jit_compile):
    """Traces and runs one tf.function computing TensorFlow's references the entries need
    and each entry's derivative. Returns {name: gradients} and, per entry, the fallback
    warnings its tracing raised."""
    caught, nones = {}, {}

    def step(*args):
        it = iter(args)
        xs = [x if isinstance(x, tf.Variable) else next(it) for x in case_.inputs]
        out = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # The references the entries need (both when no entry is given).
            if not entries or any(e != "tape" for e in entries):
                out["tf.gradients"] = _derivative(_by_gradients(_plain), case_.fn, xs,
                                                  case_.order)
            if not entries or "tape" in entries:
                out["tf.GradientTape"] = _derivative(_by_tape(tf.GradientTape), case_.fn, xs,
                                                     case_.order)
        for entry in entries:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                if entry == "monkey_patch":
                    memgrad.monkey_patch()
                try:
                    out[entry] = _derivative(_entry_gradient(entry), case_.fn, xs, case_.order)
                finally:
                    if entry == "monkey_patch":
                        memgrad.unpatch()
            caught[entry] = [str(m.message) for m in w if "cannot rewrite" in str(m.message)]
        # None cannot leave a tf.function: which gradients are None is noted at trace time.
        for name, grads in out.items():
            nones[name] = [g is None for g in grads]
        return {name: [tf.zeros([]) if g is None else tf.convert_to_tensor(g) for g in grads]
                for name, grads in out.items()}

    args = [tf.constant(x) for x in case_.inputs if not isinstance(x, tf.Variable)]
    values = tf.function(step, jit_compile=jit_compile, autograph=False)(*args)
    values = {name: [None if none else g for g, none in zip(values[name], nones[name])]
              for name in values}
    return values, caught


def run_case(case_, jit_compile=False, entries=ENTRIES):
    """{entry: Outcome} for one case (see the module's docstring)."""
    try:
        values, caught = _run(case_, entries, jit_compile)
    except Exception:  # noqa: BLE001 - find the entry (or the reference) that raises
        values, caught = None, {}
    if values is None:
        try:
            values, _ = _run(case_, (), jit_compile)
        except Exception as error:  # noqa: BLE001 - TensorFlow's own reference fails
            detail = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
            return {entry: Outcome("unsupported", detail) for entry in entries}
        for entry in entries:
            try:
                alone, caught_alone = _run(case_, (entry,), jit_compile)
                values[entry] = alone[entry]
                caught[entry] = caught_alone[entry]
            except Exception as error:  # noqa: BLE001 - recorded as a crash
                values[entry] = error
    results = {}
    for entry in entries:
        got = values[entry]
        if isinstance(got, ValueError) and "Received: 0 marked tensors" in str(got):
            results[entry] = Outcome("unmarked", "nothing marked for 'collection'")
            continue
        if isinstance(got, Exception):
            first = (str(got).splitlines() or [""])[0][:160]
            results[entry] = Outcome("crash", f"{type(got).__name__}: {first}")
            continue
        reference = values["tf.GradientTape" if entry == "tape" else "tf.gradients"]
        problem = _compare(got, reference)
        if problem is not None:
            results[entry] = problem
        elif caught.get(entry):
            results[entry] = Outcome("fallback", _reason(caught[entry]))
        else:
            results[entry] = Outcome("exact", "")
    return results
