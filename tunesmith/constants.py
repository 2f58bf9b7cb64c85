"""Names shared by every stage."""

IGNORE_INDEX = -100
"""Label value that the loss skips (PyTorch's cross-entropy default)."""

# The default --max_forward_tokens on CPU (data/packing.py). Every forward/backward reads all the weights however
# few tokens it holds (about 0.2 s a pass for SmolLM2-135M on a 2-core CPU, measured), so small forwards cost
# throughput; at 2,048 tokens that is a few percent, and activation memory stops growing with the batch.
CPU_FORWARD_TOKENS = 2048

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
# `--optim muon`: the optimizer tunesmith adds to transformers' names (train/muon.py)
MUON = "muon"
