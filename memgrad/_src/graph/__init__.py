"""The graph view and separator search; nothing here modifies a graph."""

from memgrad._src.graph.memory_model import MemoryModel, gradient_reads
from memgrad._src.graph.separators import CutProfile, cut_profile, single_tensor_separators
from memgrad._src.graph.view import ForwardGraph, op_flops, tensor_bytes

__all__ = [
    "CutProfile",
    "ForwardGraph",
    "MemoryModel",
    "gradient_reads",
    "cut_profile",
    "op_flops",
    "single_tensor_separators",
    "tensor_bytes",
]
