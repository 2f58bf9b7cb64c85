"""What users bring: tool calls (OpenAI and ShareGPT/glaive), content parts, reasoning, fields that
change a row's meaning, files named for the other JSON flavour, and many bad rows at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.core.data.test_template_families import TOOLS_JSON, family, trained_pieces
from tunesmith.data.formats import BadRows, DataError, conversation_from_row, load_conversations, load_items
from tunesmith.data.template import encode_conversation


def write(path: Path, rows: list, as_array: bool = False) -> str:
    text = json.dumps(rows, indent=1) if as_array else "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return str(path)


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
OPENAI_TOOL_ROW = {
    "tools": [WEATHER_TOOL],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "assistant", "content": "18C in Paris."},
    ],
}
# LLaMA-Factory's glaive_toolcall files: the call and the tool list are JSON text.
SHAREGPT_TOOL_ROW = {
    "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"},
        {"from": "observation", "value": "18C"},
        {"from": "gpt", "value": "18C in Paris."},
    ],
    "tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}]),
    "system": "You are a weather bot.",
}


@pytest.mark.parametrize("row", [OPENAI_TOOL_ROW, SHAREGPT_TOOL_ROW], ids=["openai", "sharegpt-glaive"])
def test_tool_calls_reach_the_template_and_train(tmp_path, tokenizer, row):
    (conv,) = load_conversations([write(tmp_path / "t.jsonl", [row])])
    call = conv.messages[-3] if conv.messages[0]["role"] != "system" else conv.messages[2]
    assert call["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert conv.tools == [WEATHER_TOOL] or conv.tools[0]["function"]["name"] == "get_weather"
    tok = family(tokenizer, TOOLS_JSON, "<tool_call>", "</tool_call>")
    pieces = trained_pieces(tok, encode_conversation(tok, conv.messages, tools=conv.tools))
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|im_end|>' in pieces
    assert "18C in Paris.<|im_end|>" in pieces and "You are a weather bot" not in pieces
    if "system" in row:  # ShareGPT's top-level system is honoured
        assert conv.messages[0] == {"role": "system", "content": "You are a weather bot."}


def test_content_parts_and_reasoning(tmp_path):
    row = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": [{"type": "reasoning", "text": "Greet back."}, {"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "Again"},
        {"role": "assistant", "content": "Hello again!", "reasoning_content": "Still greeting."},
    ]}
    llama_factory = {"messages": [{"role": "user", "content": [{"type": "text", "value": "Hi"}]},
                                  {"role": "assistant", "content": "Hello."}]}
    first, second = load_conversations([write(tmp_path / "p.jsonl", [row, llama_factory])])
    assert first.messages[0]["content"] == "Hi there"
    assert first.messages[1] == {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."}
    assert first.messages[3]["reasoning_content"] == "Still greeting."
    assert second.messages[0]["content"] == "Hi"


@pytest.mark.parametrize("row, message", [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]},
                   {"role": "assistant", "content": "A cat."}]},
     r"field `messages\[0\].content\[0\]`: image file not found: \S+x.png \(a relative path is relative to the "
     r"data file's folder\)"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": ""}}]},
                   {"role": "assistant", "content": "A cat."}]},
     r"field `messages\[0\].content\[0\].type`: content part of type 'input_audio': tunesmith reads text, image"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]},
     r"field `messages\[1\].content`: empty reply: nothing to train"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}]},
     r"field `messages\[1\].content`: empty reply"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes", "weight": 0.5}]},
     r"field `messages\[1\].weight`: expected 0 or 1"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Bad answer"}], "label": False},
     r"field `label`: a KTO row"),
    ({"messages": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am {{name}}."}]},
     r"unfilled placeholder \{\{name\}\}"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}, {"role": "tool", "content": "x"},
        {"role": "assistant", "content": "ok"}]}, r"field `messages\[1\].tool_calls\[0\].function.arguments`: "
                                                  r"`arguments` is not valid JSON"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "tool", "content": "x"},
                   {"role": "assistant", "content": "ok"}]}, r"'tool' cannot come after 'user'"),
])
def test_rows_that_cannot_be_used_are_named(tmp_path, row, message):
    with pytest.raises(DataError, match=message):
        load_conversations([write(tmp_path / "bad.jsonl", [row])])


def test_weight_zero_keeps_a_reply_as_context(tmp_path):
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hm.", "weight": 0},
                        {"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello!", "weight": 1}]}
    (conv,) = load_conversations([write(tmp_path / "w.jsonl", [row])])
    assert conv.messages[1]["loss"] is False and conv.messages[3]["loss"] is True


def test_the_json_flavour_is_read_from_the_content_not_the_name(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": f"A{i}"}]}
            for i in range(3)]
    jsonl_named_json = write(tmp_path / "a.json", rows)
    array_named_jsonl = write(tmp_path / "b.jsonl", rows, as_array=True)
    one_object = tmp_path / "c.json"
    one_object.write_text(json.dumps(rows[0], indent=2))
    assert len(load_conversations([jsonl_named_json])) == 3
    convs = load_conversations([array_named_jsonl])
    assert [c.row.index for c in convs] == [1, 2, 3] and convs[1].row.line > convs[0].row.line
    assert len(load_conversations([str(one_object)])) == 1


def test_every_bad_row_is_listed_and_skip_bad_rows_leaves_them_out(tmp_path):
    good = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
    ends_on_user = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
                                      {"from": "human", "value": "Bye"}]}
    rows = [good, ends_on_user] * 25 + ["not an object"]
    path = write(tmp_path / "d.jsonl", rows)
    with pytest.raises(BadRows) as err:
        load_conversations([path])
    text = str(err.value)
    assert text.startswith("26 bad rows (fix them, or pass --skip_bad_rows")
    assert f"{path}:line 2: field `conversations`: wrong role order: the last turn must be 'assistant'" in text
    assert text.count(f"{path}:line ") == 20 and text.endswith("... and 6 more")
    items, problems = load_items([path], conversation_from_row, skip_bad_rows=True)
    assert len(items) == 25 and len(problems) == 26 and problems[-1].startswith(f"{path}:line 51: expected a JSON object")


def test_reasoning_trains_where_the_template_keeps_it(tokenizer):
    from tests.core.data.test_template_families import QWEN3_LIKE

    tok = family(tokenizer, QWEN3_LIKE, "<think>", "</think>")
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4.", "reasoning_content": "Two twos."}]
    assert trained_pieces(tok, encode_conversation(tok, messages)) == "<think>\nTwo twos.\n</think>\n\n4.<|im_end|>"


def test_a_preference_context_may_end_with_a_tool_result(tmp_path):
    from tunesmith.data.preference import load_pairs

    row = {"messages": OPENAI_TOOL_ROW["messages"][:3], "tools": [WEATHER_TOOL],
           "chosen": "18C in Paris.", "rejected": "I cannot know."}
    (pair,) = load_pairs([write(tmp_path / "p.jsonl", [row])])
    assert pair.context[-1]["role"] == "tool"


def test_skip_bad_rows_trains_on_the_rest_and_lists_them_beside_the_outputs(tmp_path, tiny_model_dir):
    from tunesmith.sft.command import run

    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    bad = {"messages": [{"role": "user", "content": "Hi"}]}
    data = write(tmp_path / "d.jsonl", [good, bad, good, bad, good])
    flags = ["--model_name_or_path", tiny_model_dir, "--data_path", data, "--max_steps", "1", "--save_strategy", "no",
             "--report_to", "none", "--plot_loss", "false", "--per_device_train_batch_size", "2"]
    with pytest.raises(BadRows, match=r"^2 bad rows .*\n  .*d.jsonl:line 2: field `messages`: wrong role order"):
        run([*flags, "--output_dir", str(tmp_path / "strict")])
    trainer = run([*flags, "--output_dir", str(tmp_path / "out"), "--skip_bad_rows"])
    assert len(trainer.train_dataset) == 3
    listed = (tmp_path / "out" / "train_bad_rows.txt").read_text().splitlines()
    assert [line.split(": field")[0] for line in listed] == [f"{data}:line 2", f"{data}:line 4"]


def test_the_shipped_tool_demo_trains_each_call_under_chatml_tools(tokenizer):
    from tunesmith.data.template import apply_chat_template_override

    repo = Path(__file__).resolve().parents[3]
    tok = family(tokenizer, "")
    apply_chat_template_override(tok, "chatml_tools")
    convs = load_conversations([str(repo / "data" / "demo" / "tools.jsonl")])
    held_out, _ = load_items([str(repo / "data" / "demo" / "tools_heldout.jsonl")], lambda row: row)
    assert len(convs) == 160 and all(set(r.data["expected_call"]) == {"name", "arguments"} for r in held_out)
    for conv in convs[:5]:
        pieces = trained_pieces(tok, encode_conversation(tok, conv.messages, tools=conv.tools))
        call = conv.messages[1]["tool_calls"][0]["function"]
        assert f'<tool_call>{json.dumps({"name": call["name"], "arguments": call["arguments"]})}</tool_call>' in pieces
        assert conv.messages[2]["content"] not in pieces  # the tool's result is context
