"""Automatic gradient checkpointing: strategies, the rewrite and its entry points."""

from memgrad.checkpoint.analyze import Analysis, analyze
from memgrad.checkpoint.api import checkpoint, gradients, monkey_patch, unpatch
from memgrad.checkpoint.keras_hook import Checkpoint, disable_checkpointing, enable_checkpointing
from memgrad.checkpoint.strategies import CheckpointPlan
from memgrad.checkpoint.tape import GradientTape

__all__ = [
    "Analysis",
    "Checkpoint",
    "CheckpointPlan",
    "GradientTape",
    "analyze",
    "checkpoint",
    "disable_checkpointing",
    "enable_checkpointing",
    "gradients",
    "monkey_patch",
    "unpatch",
]
