"""The inspect command: its JSON is the masking the trainer uses, one line per input row in order."""

from __future__ import annotations

import json

from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.inspect import highlight_trained
from tunesmith.inspect.command import run as inspect_main

ROWS = [
    {"messages": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Tunesmith."}]},
    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"},
                       {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Goodbye!"}]},
    {"instruction": "Say yes", "output": "Yes."},
]


def test_output_file_matches_masking_in_input_order(tmp_path, default_model_path, tokenizer, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "encoded.jsonl"
    inspect_main(["--model_name_or_path", default_model_path, "--data_path", str(data), "--output_file", str(out),
                  "--color", "never"])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["line"] for r in lines] == [1, 2, 3]
    trained = [tokenizer.decode([t for t, lab in zip(r["input_ids"], r["labels"]) if lab != IGNORE_INDEX]) for r in lines]
    assert trained == ["I am Tunesmith.<|im_end|>", "Hello!<|im_end|>Goodbye!<|im_end|>", "Yes.<|im_end|>"]
    printed = capsys.readouterr().out
    assert "⟦I am Tunesmith.<|im_end|>⟧" in printed
    assert "3 rows, 0 bad, 0 dropped;" in printed


def test_rows_with_nothing_trainable_are_marked_dropped(tmp_path, default_model_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n")
    out = tmp_path / "encoded.jsonl"
    # The default system prompt alone is longer than 10 tokens: no reply fits.
    inspect_main(["--model_name_or_path", default_model_path, "--data_path", str(data), "--output_file", str(out),
                  "--max_seq_length", "10", "--show", "0"])
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["dropped"] is True and len(row["input_ids"]) > 10  # shown whole, so the reader sees why


def test_highlight_colours_only_trained_runs(tokenizer):
    ids = tokenizer("ab cd", add_special_tokens=False)["input_ids"]
    labels = [IGNORE_INDEX] + ids[1:]
    text = highlight_trained(tokenizer, ids, labels, color=True)
    assert text == tokenizer.decode(ids[:1]) + "\x1b[42;30m" + tokenizer.decode(ids[1:]) + "\x1b[0m"


def test_openai_file_read_whole_and_per_message_weights_shown(tmp_path, default_model_path, tokenizer, capsys):
    """OpenAI's fine-tuning format: a reply straight after the system prompt trains; `weight` 0 (OpenAI)
    and `loss_weight` 0 (LLaMA-Factory) keep a reply as context, 1 trains it."""
    rows = [
        {"messages": [{"role": "system", "content": "You greet first."},
                      {"role": "assistant", "content": "Hello! How can I help?"},
                      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Nice to meet you."}]},
        {"messages": [{"role": "user", "content": "A?"}, {"role": "assistant", "content": "Skip me.", "weight": 0},
                      {"role": "user", "content": "B?"}, {"role": "assistant", "content": "Train me.", "weight": 1}]},
        {"conversations": [{"from": "human", "value": "C?"}, {"from": "gpt", "value": "Not me.", "loss_weight": 0.0},
                           {"from": "human", "value": "D?"}, {"from": "gpt", "value": "Me.", "loss_weight": 1.0}]},
    ]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "encoded.jsonl"
    inspect_main(["--model_name_or_path", default_model_path, "--data_path", str(data), "--output_jsonl", str(out),
                  "--color", "never"])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    trained = [tokenizer.decode([t for t, lab in zip(r["input_ids"], r["labels"]) if lab != IGNORE_INDEX]) for r in lines]
    assert trained == ["Hello! How can I help?<|im_end|>Nice to meet you.<|im_end|>", "Train me.<|im_end|>",
                       "Me.<|im_end|>"]
    printed = capsys.readouterr().out
    assert "You greet first.<|im_end|>\n<|im_start|>assistant\n⟦Hello! How can I help?<|im_end|>⟧" in printed
    assert "Skip me.<|im_end|>" in printed and "⟦Skip me." not in printed
