"""Evaluation of a model tunesmith trained or loads: lm-evaluation-harness tasks run in this process
(harness.py), the shipped offline tasks (tasks/), and base-vs-tuned comparisons with paired standard
errors (paired.py). Generated-answer scoring with reward models lives with the RL code it shares
(rl/evaluate_command.py); `tunesmith eval` is the front door to both."""

from .harness import TASKS_DIR

__all__ = ["TASKS_DIR"]
