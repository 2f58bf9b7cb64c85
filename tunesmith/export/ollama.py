"""The chat template as an Ollama Modelfile: a Go-template TEMPLATE, the SYSTEM prompt the template adds
when a conversation has none, and the stop tokens.

Jinja is not translated in general. A template is recognised as ChatML (`<|im_start|>ROLE\\nTEXT<|im_end|>\\n`
per message, `<|im_start|>assistant\\n` as the generation prompt, optionally a default system prompt
when the first message is not a system one: SmolLM2's and Qwen's shape) by rendering probe
conversations with it and with `render_chatml` below, which renders what the Go template renders
under Ollama's rules; only when every render is equal is a Modelfile written. Ollama inserts the
Modelfile's SYSTEM as the first message when a request has no system message, which is what the
template does with its default. tests/features/export/test_ollama_template.py renders the written Modelfile with Go's
text/template under Ollama's rules and compares it with the Jinja template's renders.

The Modelfile also sets what the export knows of how the model is meant to run: the stop tokens, the
sampling settings `tunesmith chat` uses by default (Ollama's own defaults differ: temperature 0.8, top_k
40, repeat_penalty 1.1, no length limit) and, as num_ctx, the --max_seq_length the model was trained
with when its folder records the training run (tunesmith_config.json)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ..constants import ASSISTANT, SYSTEM, USER
from ..data.formats import Message
from ..data.template import render_text
from ..hparams import GenerationArguments
from ..utils.paths import run_config_record

START, END = "<|im_start|>", "<|im_end|>"

# Go template (Ollama's .Messages form): every message as ChatML, an open assistant turn after the last
# message unless it is an assistant's (which Ollama then continues, so it stays open too).
CHATML_GO_TEMPLATE = (
    "{{- range $i, $_ := .Messages }}\n"
    "{{- $last := eq (len (slice $.Messages $i)) 1 -}}\n"
    f"{START}{{{{ .Role }}}}\n"
    f"{{{{ .Content }}}}{{{{ if or (ne .Role \"assistant\") (not $last) }}}}{END}\n"
    "{{ end }}\n"
    f"{{{{- if and (ne .Role \"assistant\") $last }}}}{START}assistant\n"
    "{{ end }}\n"
    "{{- end }}"
)

PROBES: list[list[Message]] = [
    [{"role": USER, "content": "Hello!"}],
    [{"role": SYSTEM, "content": "Answer briefly."}, {"role": USER, "content": "Who are you?"}],
    [{"role": USER, "content": "Hi."}, {"role": ASSISTANT, "content": "Hello."}, {"role": USER, "content": "2+2?"}],
    [{"role": SYSTEM, "content": "Be kind."}, {"role": USER, "content": "Q"}, {"role": ASSISTANT, "content": "A"}],
]


@dataclass
class OllamaChat:
    template: str  # Go template
    system: str | None  # the template's default system prompt, if it adds one
    stops: list[str]


def render_chatml(messages: list[Message], system: str | None, add_generation_prompt: bool) -> str:
    """ChatML with the default system prompt `system` (inserted when the conversation has no system
    message). With add_generation_prompt, what CHATML_GO_TEMPLATE renders in Ollama with SYSTEM `system`
    for a request (its last message not an assistant's); without, the same turns closed, as training
    renders a conversation that ends with a reply."""
    if system is not None and (not messages or messages[0]["role"] != SYSTEM):
        messages = [{"role": SYSTEM, "content": system}, *messages]
    text = "".join(f"{START}{m['role']}\n{m['content']}{END}\n" for m in messages)
    return text + (f"{START}{ASSISTANT}\n" if add_generation_prompt else "")


def _default_system(tokenizer: Any) -> str | None:
    text = render_text(tokenizer, PROBES[0], add_generation_prompt=True)
    found = re.match(re.escape(f"{START}{SYSTEM}\n") + r"(.*?)" + re.escape(END), text, flags=re.S)
    return found.group(1) if found else None


def ollama_chat(tokenizer: Any) -> tuple[OllamaChat | None, str]:
    """(the Modelfile's chat settings, "") when the tokenizer's template is ChatML-shaped, else (None, why)."""
    system = _default_system(tokenizer)
    for messages in PROBES:
        for prompt in (True, False):
            if prompt and messages[-1]["role"] == ASSISTANT:
                continue
            want = render_text(tokenizer, messages, add_generation_prompt=prompt)
            if render_chatml(messages, system, prompt) != want:
                roles = "/".join(m["role"] for m in messages)
                return None, (f"the chat template does not render ChatML (checked on a {roles} conversation"
                              f"{' with a generation prompt' if prompt else ''}: {want[:60]!r}...)")
    if system is not None and '"""' in system:
        return None, 'its default system prompt contains """, which a Modelfile cannot quote'
    if system is not None and not all(c.isprintable() or c in "\n\t" for c in system):
        # Ollama's Modelfile reader drops such characters (zero-width joiners, control characters).
        return None, "its default system prompt has characters a Modelfile drops (control or format characters)"
    stops = [END] + ([tokenizer.eos_token] if tokenizer.eos_token not in (None, END) else [])
    return OllamaChat(CHATML_GO_TEMPLATE, system, stops), ""


def training_record(model_name_or_path: str | None, adapter_name_or_path: str | None) -> dict:
    """The tunesmith_config.json of the training run behind a model ({} when none is recorded): the
    adapter's, else the model folder's; for a merged folder (whose record is the merge's), the merged
    adapter's."""
    for folder in (adapter_name_or_path, model_name_or_path):
        record = run_config_record(folder) if folder and os.path.isdir(folder) else {}
        if "MergeArguments" in record:
            merged = record.get("ModelArguments", {}).get("adapter_name_or_path")
            record = run_config_record(merged) if merged and os.path.isdir(merged) else {}
        if record:
            return record
    return {}


def ollama_parameters(model_name_or_path: str | None, adapter_name_or_path: str | None) -> dict[str, float | int]:
    """The Modelfile's PARAMETERs besides the stops: `tunesmith chat`'s default sampling settings, and
    num_ctx, the --max_seq_length the training run recorded (if any)."""
    g = GenerationArguments()
    parameters: dict[str, float | int] = {
        "temperature": g.temperature if g.do_sample else 0, "top_p": g.top_p, "top_k": g.top_k, "min_p": g.min_p,
        "repeat_penalty": g.repetition_penalty, "num_predict": g.max_new_tokens}
    record = training_record(model_name_or_path, adapter_name_or_path)
    lengths = [s["max_seq_length"] for s in record.values() if isinstance(s, dict) and "max_seq_length" in s]
    if lengths and isinstance(lengths[0], int):
        parameters["num_ctx"] = lengths[0]
    return parameters


def modelfile_text(gguf_name: str, chat: OllamaChat, source: str,
                   parameters: dict[str, float | int] | None = None, projector_name: str | None = None) -> str:
    """The Modelfile; a vision-language model's mmproj file goes in a second FROM line, which Ollama's create
    stores as the model's projector layer."""
    lines = [f"# Written by tunesmith from {source}: `ollama create NAME -f THIS_FILE`, then `ollama run NAME`.",
             f"FROM ./{gguf_name}", *([f"FROM ./{projector_name}"] if projector_name else []),
             f'TEMPLATE """{chat.template}"""']
    if chat.system is not None:
        lines.append(f'SYSTEM """{chat.system}"""')
    if parameters:
        lines.append("# Sampling as `tunesmith chat` samples by default"
                     + ("; num_ctx: the --max_seq_length it was trained with." if "num_ctx" in parameters else "."))
        lines += [f"PARAMETER {name} {value:g}" if isinstance(value, float) else f"PARAMETER {name} {value}"
                  for name, value in parameters.items()]
    lines += [f'PARAMETER stop "{stop}"' for stop in chat.stops]
    return "\n".join(lines) + "\n"
