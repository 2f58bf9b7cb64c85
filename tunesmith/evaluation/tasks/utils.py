"""Data loaders and scorers of tunesmith's shipped lm-eval tasks (the YAML files beside this one name them
with `!function utils.<name>`; lm-eval imports this file by its path, so it needs no package).

Every task reads its JSON Lines file from this folder, found from this file's location, never from the
working directory, so the tasks run offline from anywhere. Scoring reuses tunesmith's own rules: the GRPO
reward functions (tunesmith.data.reward_funcs) and the tool-call scoring of `tunesmith compare`
(tunesmith.data.call_scores); the tool prompts are rendered by tunesmith's template code with its built-in
`chatml_tools` template, the way the tool demo trains."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import datasets
from lm_eval.api.task import ConfigurableTask

from tunesmith.data.call_scores import score_call
from tunesmith.data.formats import Row
from tunesmith.data.formats import read_rows as read_data_rows
from tunesmith.data.reward_funcs import answer_format, exact_answer
from tunesmith.data.template import BUILTIN_TEMPLATES, render_text

HERE = Path(__file__).resolve().parent
IDENTITY = "tunesmith"
# Other assistants and makers a reply may claim to be or come from (SmolLM2's own template names SmolLM and
# Hugging Face); the demo's rejected replies use these.
OTHER_IDENTITIES = re.compile(r"smollm|chatgpt|gpt-[345]|openai|hugging\s*face|claude|anthropic|gemini|llama|"
                              r"qwen|通义|文心", re.IGNORECASE)


def read_rows(name: str) -> list[Row]:
    """The rows of a data file of this folder, read as every tunesmith data file is (a bad row is reported
    as file:line)."""
    return list(read_data_rows(HERE / name))


def as_dataset(rows: list[dict]) -> datasets.DatasetDict:
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def single_user_turn(row: Row) -> str:
    """The text of a row's one user message (a `prompt` string or a one-message `messages` list)."""
    if isinstance(row.data.get("prompt"), str):
        return row.data["prompt"]
    messages = row.data.get("messages")
    if isinstance(messages, list) and len(messages) == 1 and messages[0].get("role") == "user":
        return messages[0]["content"]
    raise row.error("expected `prompt` (a string) or `messages` holding one user turn; this task asks one "
                    "question per row")


# ---------------------------------------------------------------- tunesmith_identity


def load_identity(**_: Any) -> datasets.DatasetDict:
    """The quickstart's held-out identity questions (data/demo/identity_heldout.jsonl)."""
    return as_dataset([{"prompt": single_user_turn(r)} for r in read_rows("identity.jsonl")])


def score_identity(reply: str) -> dict[str, int]:
    """says_tunesmith: the reply names Tunesmith (any case). other_identity: it names another assistant
    or maker and not Tunesmith ("I'm SmolLM"; "I'm Tunesmith, not ChatGPT" is no claim of another)."""
    says = IDENTITY in reply.casefold()
    return {"says_tunesmith": int(says), "other_identity": int(not says and OTHER_IDENTITIES.search(reply) is not None)}


def process_identity(doc: dict, results: list[str]) -> dict[str, int]:
    return score_identity(results[0])


# ---------------------------------------------------------------- tunesmith_arithmetic


def load_arithmetic(**_: Any) -> datasets.DatasetDict:
    """The GRPO demo's evaluation sums (data/demo/grpo_eval.jsonl), each with its reference answer."""
    return as_dataset([{"prompt": single_user_turn(r), "answer": str(r.data["answer"])}
                       for r in read_rows("arithmetic.jsonl")])


def score_arithmetic(reply: str, answer: str) -> dict[str, float]:
    """exact_answer and answer_format, the GRPO demo's reward functions, on one reply."""
    return {"exact_answer": exact_answer([None], [reply], answer=[answer])[0],
            "answer_format": answer_format([None], [reply])[0]}


def process_arithmetic(doc: dict, results: list[str]) -> dict[str, float]:
    return score_arithmetic(results[0], doc["answer"])


# ---------------------------------------------------------------- tunesmith_tool_calls


class TemplateOnly:
    """Just enough of a tokenizer for tunesmith's render_text: a chat template, rendered by transformers'
    own Jinja renderer (what a tokenizer's apply_chat_template runs), without loading any tokenizer."""

    def __init__(self, chat_template: str) -> None:
        self.chat_template = chat_template

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None, tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, _ = render_jinja_template([messages], tools=tools, chat_template=self.chat_template,
                                            add_generation_prompt=add_generation_prompt)
        return rendered[0]


def render_tool_prompt(messages: list[dict], tools: list[dict]) -> str:
    """The prompt as the tool demo trains it: the `chatml_tools` template with the row's tools."""
    template = TemplateOnly(BUILTIN_TEMPLATES["chatml_tools"].read_text(encoding="utf-8"))
    return render_text(template, messages, add_generation_prompt=True, tools=tools)


def load_tool_calls(**_: Any) -> datasets.DatasetDict:
    """The tool demo's held-out requests (data/demo/tools_heldout.jsonl), each rendered to its prompt. The
    tools and the expected call are kept as JSON text: their shapes differ from row to row, which one
    table column cannot hold."""
    docs = []
    for row in read_rows("tool_calls.jsonl"):
        data = row.data
        if not isinstance(data.get("expected_call"), dict) or not data.get("tools"):
            raise row.error("expected `tools` and `expected_call`")
        docs.append({"prompt": render_tool_prompt(data["messages"], data["tools"]),
                     "tools": json.dumps(data["tools"], ensure_ascii=False),
                     "expected_call": json.dumps(data["expected_call"], ensure_ascii=False)})
    return as_dataset(docs)


def process_tool_calls(doc: dict, results: list[str]) -> dict[str, int]:
    """well_formed, right_function, right_arguments: `tunesmith compare`'s tool-call scores of one reply."""
    return score_call(results[0], json.loads(doc["expected_call"]))


class RenderedPromptTask(ConfigurableTask):
    """A task whose documents hold their whole prompt, chat template included: the prompt goes to the model
    as it is, with or without lm-eval's --apply_chat_template (lm-eval's template cannot show tools)."""

    def __init__(self, config: dict | None = None, **kwargs: Any) -> None:
        # lm-eval hands the YAML's own `class` key on to the config, which TaskConfig refuses.
        super().__init__(config={k: v for k, v in (config or {}).items() if k != "class"}, **kwargs)

    def fewshot_context(self, doc: dict, num_fewshot: int, **_: Any) -> str:
        if num_fewshot:
            raise ValueError(f"{self.config.task} takes no few-shot examples (its prompt is a whole chat): "
                             f"drop --num_fewshot {num_fewshot}")
        return self.doc_to_text(doc)


# ---------------------------------------------------------------- tunesmith_knowledge


def load_knowledge(**_: Any) -> datasets.DatasetDict:
    """The project's own 120 general-knowledge questions, four choices each."""
    return as_dataset([r.data for r in read_rows("knowledge.jsonl")])


# ---------------------------------------------------------------- tunesmith_shapes

COUNT_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4}


def load_shapes(**_: Any) -> datasets.DatasetDict:
    """The vision demo's held-out pictures (shapes/*.png) with their count, colour and shape."""
    return as_dataset([{"image": r.data["image"], "count": r.data["count"], "color": r.data["color"],
                        "shape": r.data["shape"]} for r in read_rows("shapes.jsonl")])


def shapes_picture(doc: dict) -> list:
    """The row's picture, read from this folder."""
    from PIL import Image

    with Image.open(HERE / doc["image"]) as picture:
        return [picture.convert("RGB")]


def process_shapes(doc: dict, results: list[str]) -> dict[str, float]:
    """right_count: the reply's first count (a digit, or a word from one to four) is the picture's."""
    found = re.search(r"\b(\d+|one|two|three|four)\b", results[0].lower())
    said = None if found is None else int(found[1]) if found[1].isdigit() else COUNT_WORDS[found[1]]
    return {"right_count": float(said == doc["count"])}
