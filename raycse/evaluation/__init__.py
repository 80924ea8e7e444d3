"""Evaluation: STS in the SentEval layout (and, later, the elongation attack)."""

from raycse.evaluation.sts import TASKS, evaluate_datasets, evaluate_senteval, load_task, read_stsb

__all__ = ["TASKS", "evaluate_datasets", "evaluate_senteval", "load_task", "read_stsb"]
