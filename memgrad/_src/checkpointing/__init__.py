"""Automatic gradient checkpointing: strategies, the rewrite and its entry points."""

from memgrad._src.checkpointing.analyze import Analysis, analyze
from memgrad._src.checkpointing.budget import Budget, BudgetError, CurvePoint, budget_curve
from memgrad._src.checkpointing.api import gradients
from memgrad._src.checkpointing.marker import Checkpoint, mark_checkpoint
from memgrad._src.checkpointing.rewrite_log import RewriteRecord, record_rewrites
from memgrad._src.checkpointing.patch import monkey_patch, unpatch
from memgrad._src.checkpointing.keras_hook import disable_checkpointing, enable_checkpointing
from memgrad._src.checkpointing.loops import LoopRecord
from memgrad._src.checkpointing.strategies import CheckpointPlan
from memgrad._src.checkpointing.tape import GradientTape

__all__ = [
    "Analysis",
    "Budget",
    "BudgetError",
    "CurvePoint",
    "budget_curve",
    "Checkpoint",
    "CheckpointPlan",
    "GradientTape",
    "LoopRecord",
    "RewriteRecord",
    "record_rewrites",
    "analyze",
    "mark_checkpoint",
    "disable_checkpointing",
    "enable_checkpointing",
    "gradients",
    "monkey_patch",
    "unpatch",
]
