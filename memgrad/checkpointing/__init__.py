"""Automatic gradient checkpointing: strategies, the rewrite and its entry points."""

from memgrad.checkpointing.analyze import Analysis, analyze
from memgrad.checkpointing.budget import Budget, BudgetError, CurvePoint, budget_curve
from memgrad.checkpointing.api import checkpoint, gradients, monkey_patch, unpatch
from memgrad.checkpointing.keras_hook import Checkpoint, disable_checkpointing, enable_checkpointing
from memgrad.checkpointing.strategies import CheckpointPlan
from memgrad.checkpointing.tape import GradientTape

__all__ = [
    "Analysis",
    "Budget",
    "BudgetError",
    "CurvePoint",
    "budget_curve",
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
