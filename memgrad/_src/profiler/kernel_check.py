"""Which of TensorFlow's half-precision product kernels compute right on this CPU.

TensorFlow picks its CPU kernels by CPU and by ``TF_ENABLE_ONEDNN_OPTS``, and a kernel can be
wrong on one CPU only: in TensorFlow 2.21 with oneDNN on an Intel CPU with AVX512-FP16,
``tf.einsum('...i,ij->...j')`` in float16 is off by more than its own size, while a 2-D
``tf.matmul`` of the same operands is right. The check runs each product on small operands
rounded to the half dtype and compares it with NumPy's float64 product of the same rounded
values, so the reference owes nothing to TensorFlow's kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import platform

import numpy as np

from memgrad._src import tf_internals

HALF_DTYPES = ("float16", "bfloat16")
# Unit roundoff: half the distance from 1 to the next representable number.
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# A right kernel rounds each product and sum: its relative error (Frobenius) stays within a
# few units of roundoff for the 8-term sums below (at most 1.0 unit measured, float16 and
# bfloat16, oneDNN on and off, on an Intel Ice Lake Xeon); the wrong float16 einsum on an
# AVX512-FP16 Xeon was off by 1.2-1.5, about 2,500 units.
TOLERANCE_UNITS = 16
# CPU flags that change TensorFlow's kernels (oneDNN's code paths), as /proc/cpuinfo names them.
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_fp16")


def _probes():
    """``(name, equation for numpy, shapes, function of two tensors)`` for each product."""
    import tensorflow as tf

    def matmul_2d(a, b):  # what Invertible1x1Conv runs
        return tf.reshape(tf.matmul(tf.reshape(a, [-1, a.shape[-1]]), b), [*a.shape[:-1], b.shape[-1]])

    def conv_1x1(a, b):
        return tf.nn.conv2d(a, tf.reshape(b, [1, 1, *b.shape]), strides=1, padding="VALID")

    return [
        ("einsum '...i,ij->...j'", "...i,ij->...j", ([4, 8], [8, 8]), lambda a, b: tf.einsum("...i,ij->...j", a, b)),
        ("einsum '...i,ij->...j'", "...i,ij->...j", ([2, 8, 8, 8], [8, 8]),
         lambda a, b: tf.einsum("...i,ij->...j", a, b)),
        ("einsum 'abc,cd->abd'", "abc,cd->abd", ([2, 8, 8], [8, 8]), lambda a, b: tf.einsum("abc,cd->abd", a, b)),
        ("einsum 'abcd,de->abce'", "abcd,de->abce", ([2, 8, 8, 8], [8, 8]),
         lambda a, b: tf.einsum("abcd,de->abce", a, b)),
        ("matmul 2-D", "ij,jk->ik", ([64, 8], [8, 8]), tf.matmul),
        ("matmul 2-D of a reshape", "...i,ij->...j", ([2, 8, 8, 8], [8, 8]), matmul_2d),
        ("matmul broadcast (BatchMatMulV2)", "...i,ij->...j", ([2, 8, 8, 8], [8, 8]), tf.matmul),
        ("tensordot", "...i,ij->...j", ([2, 8, 8, 8], [8, 8]), lambda a, b: tf.tensordot(a, b, [[3], [0]])),
        ("conv2d 1x1", "...i,ij->...j", ([2, 8, 8, 8], [8, 8]), conv_1x1),
    ]


@dataclasses.dataclass(frozen=True)
class KernelResult:
    """One product in one dtype.

    Attributes:
      op: the TensorFlow call, e.g. ``"einsum '...i,ij->...j'"``.
      dtype: ``'float16'`` or ``'bfloat16'``.
      shapes: the two operands' shapes.
      relative_error: ``|got - exact| / |exact|`` (Frobenius norms), exact being float64's
        product of the same rounded operands; ``None`` if TensorFlow has no kernel for it.
      tolerance: the largest relative error a right kernel shows.
      unavailable: TensorFlow's error when it has no kernel for the product in this dtype.
    """

    op: str
    dtype: str
    shapes: tuple
    relative_error: float | None
    tolerance: float
    unavailable: str | None = None

    @property
    def right(self) -> bool | None:
        """Whether the kernel computed the product within its rounding (``None``: no kernel)."""
        if self.relative_error is None:
            return None
        return bool(np.isfinite(self.relative_error)) and self.relative_error <= self.tolerance


@dataclasses.dataclass(frozen=True)
class KernelCheck:
    """What `check_half_precision_kernels` found on this machine.

    Attributes:
      cpu: the CPU's model name.
      cpu_features: the kernel-relevant CPU flags present (AVX-512, AVX512-FP16, AMX, ...).
      onednn: whether TensorFlow runs oneDNN's kernels in this process.
      tensorflow: TensorFlow's version.
      results: one `KernelResult` per product and dtype.
    """

    cpu: str
    cpu_features: tuple
    onednn: bool
    tensorflow: str
    results: tuple

    @property
    def wrong(self) -> list:
        """The results of the kernels that computed wrong products here."""
        return [r for r in self.results if r.right is False]

    def as_dict(self) -> dict:
        """The check as a plain dict (JSON-serialisable)."""
        fields = dataclasses.asdict(self)
        for result, row in zip(self.results, fields["results"]):
            row["right"] = result.right
        return fields

    def warning(self):
        """One paragraph naming the wrong kernels and what to do, or ``None`` if all are right."""
        if not self.wrong:
            return None
        names = sorted({f"{r.op} in {r.dtype}" for r in self.wrong})
        worst = max(r.relative_error for r in self.wrong)
        return (f"TensorFlow {self.tensorflow}'s {'oneDNN' if self.onednn else 'Eigen'} kernels compute wrong "
                f"half-precision products on this CPU ({self.cpu}): {'; '.join(names)} (relative error up to "
                f"{worst:.2g}). memgrad's own layers avoid them; a model of yours that calls them in half "
                "precision trains on wrong numbers. Set TF_ENABLE_ONEDNN_OPTS=0 before TensorFlow starts, or "
                "use the 2-D matmul (docs/known_issues.md).")

    def __str__(self) -> str:
        lines = [f"half-precision kernels on {self.cpu} [{' '.join(self.cpu_features) or 'no AVX-512/AMX'}], "
                 f"oneDNN {'on' if self.onednn else 'off'}, TensorFlow {self.tensorflow}:"]
        for r in self.results:
            shapes = " x ".join(str(list(s)) for s in r.shapes)
            found = (f"no kernel: {r.unavailable}" if r.right is None
                     else f"relative error {r.relative_error:.2g} (tolerance {r.tolerance:.2g})")
            verdict = {True: "right", False: "WRONG", None: "n/a"}[r.right]
            lines.append(f"  {verdict:<5}  {r.dtype:<8}  {r.op:<34} {shapes:<21} {found}")
        return "\n".join(lines)


def cpu_description() -> tuple:
    """``(model name, kernel-relevant flags present)`` of this machine's CPU (Linux reads
    /proc/cpuinfo; elsewhere the model is `platform.processor()` and the flags are empty)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    model = value.strip()
                elif key.strip() in ("flags", "Features"):
                    flags.update(value.split())
                if key.strip() == "" and flags:  # the first processor's block is enough
                    break
    except OSError:
        pass
    return model, tuple(f for f in CPU_FEATURES if f in flags)


def _relative_error(got, exact):
    got = np.asarray(got, np.float64)
    return float(np.linalg.norm(got - exact) / max(np.linalg.norm(exact), 1e-300))


@functools.lru_cache(maxsize=None)
def _check(onednn: bool) -> KernelCheck:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    results = []
    with tf.device("CPU:0"):
        for name, equation, shapes, product in _probes():
            a64, b64 = (rng.standard_normal(shape) for shape in shapes)
            for dtype in HALF_DTYPES:
                a, b = tf.cast(a64, dtype), tf.cast(b64, dtype)  # rounded once, to the half dtype
                exact = np.einsum(equation, tf.cast(a, tf.float64).numpy(), tf.cast(b, tf.float64).numpy())
                error, unavailable = None, None
                try:
                    error = _relative_error(tf.cast(product(a, b), tf.float64).numpy(), exact)
                except tf.errors.NotFoundError as missing:  # no kernel registered for this dtype
                    unavailable = str(missing).splitlines()[0][:120]
                results.append(KernelResult(name, dtype, tuple(tuple(s) for s in shapes), error,
                                            TOLERANCE_UNITS * UNIT_ROUNDOFF[dtype], unavailable))
    cpu, features = cpu_description()
    return KernelCheck(cpu=cpu, cpu_features=features, onednn=onednn, tensorflow=tf.__version__,
                       results=tuple(results))


def check_half_precision_kernels() -> KernelCheck:
    """Checks TensorFlow's float16 and bfloat16 product kernels on this CPU.

    Runs einsum (with and without an ellipsis), 2-D and broadcast matmul, tensordot and a
    1x1 convolution on small operands rounded to each half dtype, and compares each with
    NumPy's float64 product of the same rounded operands. A kernel is right when its relative
    error stays within its dtype's rounding. The answer depends on the CPU and on whether
    TensorFlow runs oneDNN (fixed for a process), so it is computed once per process (about
    0.1 s). ``memgrad-profile`` prints the check's warning when it profiles a model that
    computes in half precision on a CPU where a kernel is wrong.

    Returns:
      A `KernelCheck`: the CPU, oneDNN's state, one `KernelResult` per product and dtype, and
      ``wrong``, the results of the kernels that are wrong here.

    Example:
      ```python
      check = memgrad.profiler.check_half_precision_kernels()
      print(check)               # one line per product and dtype: right, WRONG or n/a
      if check.wrong:
          print(check.warning())
      ```
    """
    return _check(bool(tf_internals.onednn_enabled()))


__all__ = ["KernelCheck", "KernelResult", "check_half_precision_kernels", "cpu_description"]