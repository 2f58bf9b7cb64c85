"""Agent rollouts: the policy answers, and where its reply is a tool call the function runs, its result is
appended as a `tool` message and the policy goes on, up to `max_tool_calls` calls per trajectory.

Rounds: every active row is generated in one engine call (the engine batches them; a row that finishes
early leaves the batch at once), the calls the replies make run together (rl/toolbox.py: time limit, errors
as text), and the rows that called continue in the next round while the others are done. The calls are
parsed in the format the chat template teaches (data/tool_calls.py), against the tools the prompt offers.

The tokens are what the model sees when the whole conversation is rendered by its chat template: after
each call turn, the tool messages and the next generation prompt are rendered, and the tokens the
rendering adds after the ones already there are inserted. Where the model's own words differ from the
template's rendering of them (its call re-serialised with other spacing; a merge across the turn's end),
the sampled tokens are kept, since they are what the policy produced and is trained on, and the text the
template puts after that turn's end-of-turn token is tokenized on its own (counted in `respliced`).
Only sampled tokens train (their end-of-turn token included); inserted ones (tool results, the template's
wrapping, the next assistant header) are context, as user turns are in SFT."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..constants import ASSISTANT, TOOL, USER
from ..data.formats import Message
from ..data.prompts import Prompt
from ..data.template import PromptTooLong, encode_prompt, fit_prompt, render_text, template_name
from ..data.tool_calls import ToolCall, parse_calls, tool_names
from ..errors import TemplateError
from ..generation import Completion, Engine, SamplingParams
from .args import RESULT_TOKENS
from .rollout import completion_tokens
from .toolbox import Toolbox

logger = logging.getLogger(__name__)

# Why a trajectory ended: its last reply was no call (stop), a turn ran out of tokens or the trajectory out of
# its budget (length), or the model asked for more calls than --max_tool_calls allows (max_tool_calls, the
# asking reply kept, its calls not run).
STOP, LENGTH, MAX_TOOL_CALLS = "stop", "length", "max_tool_calls"


@dataclass
class Trajectory:
    """One prompt's rollout. `token_ids` follow `prompt_ids` (the prompt rendered with its tools): the model's
    turns and the inserted tool results, one `trained` flag per token (True exactly where the model sampled
    the token). `ended`: the last turn ended with an end-of-turn token and nothing was cut. `messages`: the
    prompt's messages and every turn after them, as the template renders them (for logging and rewards)."""

    prompt: Prompt
    prompt_ids: list[int]
    tools: list[dict]
    token_ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    # the rollout engine's log-probability of each sampled token (NaN for inserted ones, or where it gave none)
    logprobs: list[float] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: int = 0
    failed_calls: int = 0
    # Call turns after which the rendering did not reproduce the tokens so far (see the module's text); once one
    # has, every later call turn counts too, since the earlier turn's tokens still differ from its rendering.
    respliced: int = 0

    @property
    def ended(self) -> bool:
        return self.finish_reason in (STOP, MAX_TOOL_CALLS)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def new_messages(self) -> list[Message]:
        """The turns after the prompt: assistant replies and tool results, in order."""
        return self.messages[len(self.prompt.messages):]

    def add(self, ids: Sequence[int], trained: bool, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids += list(ids)
        self.trained += [trained] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [float("nan")] * len(ids)


def encode_tool_prompts(tokenizer: Any, prompts: Sequence[Prompt], toolbox: Toolbox, max_length: int,
                        name: str = "prompts") -> list[Prompt]:
    """The prompts encoded with the tools each offers (Toolbox.offered) listed by the chat template, their
    oldest turns dropped to fit max_length as the data module fits prompts, and those that cannot fit left out
    (the count logged). Call it once on the prompts a tool rollout will answer; a template that cannot show
    the tools or the calls is refused here (check_renders_tools)."""
    check_renders_tools(tokenizer, toolbox)
    with_tools = []
    for prompt in prompts:
        try:
            ids, messages, _ = fit_prompt(tokenizer, prompt.messages, max_length, tools=toolbox.offered(prompt))
        except PromptTooLong:
            continue
        with_tools.append(Prompt(prompt.row, messages, tuple(ids)))
    if len(with_tools) < len(prompts):
        logger.warning(
            "%s: %d of %d prompts left out: with the tools listed they are longer than %d tokens",
            name, len(prompts) - len(with_tools), len(prompts), max_length)
    return with_tools


PROBE = "tunesmith probe"


def check_renders_tools(tokenizer: Any, toolbox: Toolbox) -> None:
    """A TemplateError unless the chat template lists the tools in the prompt (SmolLM2's own ignores them:
    the policy would never see the functions) and renders a call and its result."""
    asked = [{"role": USER, "content": PROBE}]
    if render_text(tokenizer, asked, add_generation_prompt=True, tools=toolbox.schemas) == render_text(
            tokenizer, asked, add_generation_prompt=True):
        raise TemplateError(f"{template_name(tokenizer)} does not render tools (its prompt is the same without them), "
                            "so the policy would never see the --tool_funcs functions; use a model whose template "
                            "supports tools, or one trained with --chat_template chatml_tools")
    call = {"id": "call_probe", "type": "function", "function": {"name": toolbox.names[0], "arguments": {}}}
    calling = render_text(tokenizer, [*asked, {"role": ASSISTANT, "content": None, "tool_calls": [call]}],
                          tools=toolbox.schemas)
    if calling == render_text(tokenizer, [*asked, {"role": ASSISTANT, "content": ""}], tools=toolbox.schemas):
        raise TemplateError(f"{template_name(tokenizer)} does not render the assistant's tool calls (a call turn renders "
                            "as an empty reply), so the turns after a call would not show it; use a model whose "
                            "template supports tools, or one trained with --chat_template chatml_tools")


def tool_rollout(engine: Engine, tokenizer: Any, prompts: Sequence[Prompt], params: SamplingParams, toolbox: Toolbox,
                 max_tool_calls: int, max_trajectory_tokens: int | None = None,
                 max_batch_size: int | None = None) -> list[Trajectory]:
    """One trajectory per prompt (params.n must be 1: repeat a prompt for several). Each turn is at most
    params.max_new_tokens tokens, and a trajectory at most max_trajectory_tokens, tool results included (default:
    (max_tool_calls + 1) turns of max_new_tokens and RESULT_TOKENS per call). The prompts' input_ids must be their
    rendering with their tools (encode_tool_prompts). Under ZeRO-3 (engine.synced) every process runs as many
    rounds as the busiest."""
    if params.n != 1:
        raise ValueError(f"tool_rollout samples one trajectory per prompt (got n={params.n}): repeat the prompt")
    budget = max_trajectory_tokens or (max_tool_calls + 1) * params.max_new_tokens + max_tool_calls * RESULT_TOKENS
    rows = []
    for prompt in prompts:
        tools = toolbox.offered(prompt)
        ids = encode_prompt(tokenizer, prompt.messages, tools)
        if list(prompt.input_ids) != ids:
            raise ValueError(f"{prompt.row.where()}: the prompt's input_ids are not its rendering with its tools; "
                             "encode the prompts with encode_tool_prompts")
        rows.append(Trajectory(prompt, ids, tools, messages=[dict(m) for m in prompt.messages]))
    while True:
        active = [row for row in rows if not row.done]
        if not _anyone_active(engine, bool(active)):
            break
        settings = [params.replace(max_new_tokens=min(params.max_new_tokens, budget - len(row.token_ids)))
                    for row in active]
        completions = engine.generate([row.prompt_ids + row.token_ids for row in active], settings,
                                      max_batch_size=max_batch_size)
        calling = [(row, calls) for row, [c] in zip(active, completions)
                   if (calls := _take_reply(row, c, max_tool_calls)) is not None]
        results = toolbox.run([call for _, calls in calling for call in calls])
        for row, calls in calling:
            mine, results = results[:len(calls)], results[len(calls):]
            turn = [{"role": TOOL, "tool_call_id": call.id, "name": call.name, "content": r.text}
                    for call, r in zip(calls, mine)]
            row.tool_calls += len(calls)
            row.failed_calls += sum(r.failed for r in mine)
            _insert(row, tokenizer, turn, budget)
    return rows


def _take_reply(row: Trajectory, completion: Completion, max_tool_calls: int) -> list[ToolCall] | None:
    """Add a sampled reply to the row (its tokens trained, its message appended); the calls to run when it
    is a call turn within the limit, else None and the row is done."""
    ended = completion.stop_token_id is not None
    ids, logprobs = completion_tokens(completion)
    row.add(ids, trained=True, logprobs=logprobs)
    parsed = parse_calls(completion.text, tool_names(row.tools)) if ended else None
    if parsed is None:
        row.messages.append({"role": ASSISTANT, "content": completion.text})
        row.finish_reason = STOP if ended else LENGTH
        return None
    content, calls = parsed
    row.messages.append({"role": ASSISTANT, "content": content or None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.loads(call.arguments)}}
        for call in calls]})
    if row.tool_calls + len(calls) > max_tool_calls:
        row.finish_reason = MAX_TOOL_CALLS
        return None
    return calls


def _insert(row: Trajectory, tokenizer: Any, turn: list[Message], budget: int) -> None:
    """Append the tool messages and the next generation prompt to the row, as the template renders them
    (see the module's text); a row they leave no room in is done (length), the results not inserted."""
    # A call turn ended with its end-of-turn token, the row's last token so far.
    inserted, exact = continuation_ids(tokenizer, row.messages, turn, row.tools, row.prompt_ids + row.token_ids,
                                       row.token_ids[-1])
    if len(row.token_ids) + len(inserted) >= budget:
        row.finish_reason = LENGTH
        return
    row.add(inserted, trained=False)
    row.messages += turn
    row.respliced += not exact


def continuation_ids(tokenizer: Any, messages: list[Message], turn: list[Message], tools: list[dict] | None,
                     ids: list[int], stop_token_id: int) -> tuple[list[int], bool]:
    """The tokens to insert after `ids` (a conversation whose last assistant turn, in `messages`, was sampled
    and ended with stop_token_id) so that the model reads `turn` (tool messages) and the next generation
    prompt; and whether prompt + trajectory are then exactly the tokens of the conversation's rendering.

    Exact: the rendering's tokens start with `ids`, and the rest is inserted. Otherwise the sampled tokens
    stay, and the text the rendering has after that turn's end-of-turn token is tokenized on its own."""
    full = render_text(tokenizer, [*messages, *turn], add_generation_prompt=True, tools=tools)
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    if full_ids[:len(ids)] == ids:
        return full_ids[len(ids):], True
    head = render_text(tokenizer, messages[:-1], add_generation_prompt=True, tools=tools)
    stop_text = tokenizer.decode([stop_token_id], skip_special_tokens=False)
    end = full.find(stop_text, len(head)) if full.startswith(head) and stop_text else -1
    if end < 0:
        raise TemplateError(f"{template_name(tokenizer)} cannot continue a conversation after a tool call: rendered "
                            f"with the tool results, the turns before the call change, or the call's turn does not "
                            f"end with {stop_text!r} (the token the model ended it with); use a --chat_template "
                            "whose turns end with the end-of-turn token and stay as they are once more follow")
    return tokenizer(full[end + len(stop_text):], add_special_tokens=False)["input_ids"], False


def _anyone_active(engine: Engine, active: bool) -> bool:
    """Whether any process still has rows to generate: under ZeRO-3 every forward gathers the sharded weights
    collectively, so a process whose rows are done keeps calling the engine (with no prompts: it runs idle
    forwards) until every process is done."""
    import torch.distributed as dist

    if not (engine.synced and dist.is_available() and dist.is_initialized()):
        return active
    flag = torch.tensor([1.0 if active else 0.0], device=engine.model.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())

