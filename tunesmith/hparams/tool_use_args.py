"""Tools in rollouts: the functions a policy may call while it answers, and the limits of that loop. One
dataclass shared by the RL stage (ppo/train.py) and the policy evaluation (`tunesmith eval --policy`), so the
two read the same flags with the same words (the loop itself: tunesmith/rl/tool_rollout.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import ConfigError

DEFAULT_MAX_TOOL_CALLS = 4
DEFAULT_TOOL_TIMEOUT = 10.0
# Room for each call's result in the default trajectory budget: the tool message as the template wraps it, and the
# next assistant header.
RESULT_TOKENS = 256


@dataclass
class ToolUseArguments:
    role: ClassVar[str] = "tool_use"
    _argument_group_name: ClassVar[str] = "tools in rollouts"

    tool_funcs: list[str] = field(
        default_factory=list,
        metadata={"help": "Python functions the policy may call while it answers, each `package.module:function` "
                  "(space- or comma-separated). Each needs type hints and a docstring with an Args: section: they "
                  "become the tools schema the chat template lists in the prompt (transformers' get_json_schema; a "
                  "row's own `tools` are listed instead where it has them, each naming one of these functions). A "
                  "reply that is a call runs the function, its result (or its error as text) is appended as a tool "
                  "message, and the policy goes on. Tool results are never trained; the reward sees the whole "
                  "trajectory. Needs a chat template that renders tool calls (e.g. --chat_template chatml_tools)."},
    )
    max_tool_calls: int | None = field(
        default=None,
        metadata={"help": f"With --tool_funcs: the most calls run per trajectory (default {DEFAULT_MAX_TOOL_CALLS}); a "
                  "reply that asks for more ends the trajectory, its calls not run."},
    )
    tool_timeout: float | None = field(
        default=None,
        metadata={"help": f"With --tool_funcs: seconds a call may run (default {DEFAULT_TOOL_TIMEOUT:g}); a call still "
                  "running then is given up on, and its result is an error text."},
    )
    max_trajectory_tokens: int | None = field(
        default=None,
        metadata={"help": "With --tool_funcs: the most tokens of a whole trajectory after the prompt, the model's turns "
                  "and the tool results together (each turn stays within --max_new_tokens); a trajectory that reaches "
                  "it ends unfinished. Default: (max_tool_calls + 1) times --max_new_tokens, and "
                  f"{RESULT_TOKENS} tokens per call for its result."},
    )

    def __post_init__(self) -> None:
        # `a:f,b:g` as the issue writes it, or `a:f b:g` as --reward_funcs takes them
        self.tool_funcs = [spec.strip() for item in self.tool_funcs for spec in str(item).split(",") if spec.strip()]
        given = [f"--{name}" for name in ("max_tool_calls", "tool_timeout", "max_trajectory_tokens")
                 if getattr(self, name) is not None]
        if not self.tool_funcs:
            if given:
                raise ConfigError(f"{' and '.join(given)} given without --tool_funcs: they limit the tool loop, which "
                                  "runs only with functions to call (--tool_funcs package.module:function)")
            return
        if self.max_tool_calls is None:
            self.max_tool_calls = DEFAULT_MAX_TOOL_CALLS
        if self.tool_timeout is None:
            self.tool_timeout = DEFAULT_TOOL_TIMEOUT
        for name, broken, bound in (("max_tool_calls", self.max_tool_calls < 0, "0 or more"),
                                    ("tool_timeout", self.tool_timeout <= 0, "above 0"),
                                    ("max_trajectory_tokens", (self.max_trajectory_tokens or 1) < 1, "1 or more")):
            if broken:
                raise ConfigError(f"--{name} {getattr(self, name)}: must be {bound}")

    @property
    def enabled(self) -> bool:
        return bool(self.tool_funcs)
