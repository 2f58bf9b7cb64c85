"""Names shared by every stage."""

IGNORE_INDEX = -100
"""Label value that the loss skips (PyTorch's cross-entropy default)."""

# Canonical message roles after a data format is read.
SYSTEM, USER, ASSISTANT, TOOL = "system", "user", "assistant", "tool"
ROLES = (SYSTEM, USER, ASSISTANT, TOOL)

# Per-message flag: a reply with `"loss": false` is kept as context but not trained on.
LOSS_FLAG = "loss"

# Files written beside every output.
RUN_CONFIG_FILE = "tunesmith_config.json"
LOSS_PLOT_FILE = "loss.png"
METRICS_FILE = "metrics.jsonl"  # every stage: one JSON line per logged step (and evaluation)
REWARD_PLOT_FILE = "reward.png"  # the RL stage's mean score per step
