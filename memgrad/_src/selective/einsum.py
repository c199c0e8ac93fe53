"""EinsumDense (attention projections) that keeps its input only for a trainable kernel."""

from __future__ import annotations

import string

import keras
import tensorflow as tf

from memgrad._src.selective.lean_layer import computed_weights
from memgrad._src.selective.linear import SelectiveLinear


def _split(equation):
    inputs, output = equation.replace(" ", "").split("->")
    x_spec, kernel_spec = inputs.split(",")
    return x_spec, kernel_spec, output


def _expand_ellipsis(equation, rank):
    """``equation`` with its ``...`` replaced by letters it does not use (``rank``: the input's)."""
    x_spec, kernel_spec, out_spec = _split(equation)
    if "..." not in x_spec:
        return x_spec, kernel_spec, out_spec
    unused = [c for c in string.ascii_letters if c not in equation]
    letters = "".join(unused[: rank - (len(x_spec) - 3)])
    return x_spec.replace("...", letters), kernel_spec, out_spec.replace("...", letters)


@keras.saving.register_keras_serializable(package="memgrad")
class EinsumDense(SelectiveLinear, keras.layers.EinsumDense):
    """`keras.layers.EinsumDense` that keeps its input only when its kernel is trainable.

    Same constructor arguments and weights as ``keras.layers.EinsumDense`` (the
    query/key/value/output projections of ``keras.layers.MultiHeadAttention``).
    The input gradient is ``einsum(output, kernel -> input)`` and needs only the
    kernel; the kernel gradient ``einsum(input, output -> kernel)`` needs the
    input. Equations in which a label of the input or kernel appears in neither
    other operand are rejected. An equation with ``...`` is computed with the
    ellipsis spelled out in letters (same result): TensorFlow's oneDNN einsum with an
    ellipsis is wrong in float16 on Intel CPUs with AVX512-FP16 (docs/known_issues.md).
    A LoRA-enabled or quantized layer runs Keras's computation, ellipsis included.

    Example:
      >>> projection = EinsumDense("abc,cd->abd", output_shape=(None, 64), bias_axes="d")
    """

    def _check_supported(self):
        x_spec, kernel_spec, out_spec = _split(self.equation)
        x_letters, kernel_letters, out_letters = (set(s.replace("...", "")) for s in (x_spec, kernel_spec, out_spec))
        orphans = sorted((x_letters - kernel_letters - out_letters) | (kernel_letters - x_letters - out_letters))
        if orphans or "..." in kernel_spec:
            raise ValueError(
                "memgrad's EinsumDense needs every input and kernel label in one of the other two operands "
                f"and no '...' in the kernel. Received: equation={self.equation!r}")

    def keras_call(self, inputs):
        """Keras's computation without the activation, the equation's ellipsis spelled out."""
        if computed_weights(self) or "..." not in self.equation:
            return super().keras_call(inputs)
        x_spec, kernel_spec, out_spec = _expand_ellipsis(self.equation, inputs.shape.rank)
        outputs = keras.ops.einsum(f"{x_spec},{kernel_spec}->{out_spec}", inputs, self.kernel)
        return outputs if self.bias is None else keras.ops.add(outputs, self.bias)

    def lean_weights(self):
        return [self.kernel] + ([self.bias] if self.bias is not None else [])

    def _bias_gradient(self, d_pre):
        bias_rank = len(self.bias.shape)
        leading = list(range(d_pre.shape.rank - bias_rank))
        d = tf.reduce_sum(d_pre, axis=leading) if leading else d_pre
        ones = [i for i, size in enumerate(self.bias.shape) if size == 1 and d.shape[i] != 1]
        return tf.reduce_sum(d, axis=ones, keepdims=True) if ones else d

    def _input_gradient(self, d_pre, kernel, input_shape):
        x_spec, kernel_spec, out_spec = _expand_ellipsis(self.equation, input_shape.shape[0])
        return tf.einsum(f"{out_spec},{kernel_spec}->{x_spec}", d_pre, tf.cast(kernel, d_pre.dtype))

    def _kernel_gradient(self, inputs, d_pre, kernel_shape):
        x_spec, kernel_spec, out_spec = _expand_ellipsis(self.equation, inputs.shape.rank)
        return tf.einsum(f"{x_spec},{out_spec}->{kernel_spec}", inputs, tf.cast(d_pre, inputs.dtype))
