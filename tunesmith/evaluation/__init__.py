"""`tunesmith eval` and `tunesmith compare`, one feature in one folder: their arguments (args.py), their refusals
(rules.py), lm-evaluation-harness tasks run in this process (harness.py), the shipped offline tasks (tasks/, which
lm-eval loads by path with --include_path), base-vs-tuned comparisons with paired standard errors (paired.py), and
the commands: command.py (`tunesmith eval`) and compare.py (`tunesmith compare`, two models' answers side by side).
Generated-answer scoring with reward models is the RL feature's (rl/evaluate_command.py), which `tunesmith eval
--policy` hands over to by name. It imports the core only (tests/core/test_layout.py)."""

from .harness import TASKS_DIR

__all__ = ["TASKS_DIR"]
