"""Preference rows: both formats detected per row, errors naming file, line and field, rendering
through the SFT chat-template path, and truncation that keeps both replies."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
import trl

from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.dataset import build_sft_datasets, encode_items
from tunesmith.data.formats import DataError, Row
from tunesmith.data.preference import (
    PREFERENCE_PAIRS,
    build_preference_datasets,
    detect_preference_format,
    encode_pair,
    encode_reply,
    load_pairs,
    pair_from_row,
)
from tunesmith.data.template import apply_chat_template_override, encode_examples, render_text
from tunesmith.hparams import SFTDataArguments, TrainDataArguments

USER_HI = {"role": "user", "content": "Hi"}
GOOD = [{"role": "assistant", "content": "Hello! How can I help?"}]
BAD = [{"role": "assistant", "content": "Go away."}]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Each test's own dataset cache."""
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def row(data: dict, line: int = 7) -> Row:
    return Row("prefs.jsonl", line, data)


@pytest.mark.parametrize(
    ("data", "fmt", "context", "chosen", "margin"),
    [
        ({"conversations": [{"from": "human", "value": "Hi"}], "chosen": "Hello! How can I help?",
          "rejected": "Go away."}, "sharegpt", [USER_HI], GOOD, None),
        ({"conversations": [{"from": "system", "value": "Be kind."}, {"from": "human", "value": "Hi"}],
          "chosen": {"from": "gpt", "value": "Hello! How can I help?"}, "rejected": {"from": "gpt", "value": "Go away."},
          "margin": 1.5},
         "sharegpt", [{"role": "system", "content": "Be kind."}, USER_HI], GOOD, 1.5),
        ({"conversations": [{"from": "human", "value": "Hi"}], "chosen": {"role": "assistant",
          "content": "Hello! How can I help?"}, "rejected": "Go away.", "margin": 2}, "sharegpt", [USER_HI], GOOD, 2.0),
        ({"prompt": [USER_HI], "chosen": GOOD, "rejected": BAD}, "trl", [USER_HI], GOOD, None),
        ({"prompt": "Hi", "chosen": GOOD, "rejected": BAD, "margin": 0.5}, "trl", [USER_HI], GOOD, 0.5),
        ({"messages": [USER_HI, {"role": "assistant", "content": "Hey"}, {"role": "user", "content": "Who are you?"}],
          "chosen": "Hello! How can I help?", "rejected": "Go away."},
         "trl", [USER_HI, {"role": "assistant", "content": "Hey"}, {"role": "user", "content": "Who are you?"}],
         GOOD, None),
    ],
)
def test_both_formats_are_detected_and_read(data, fmt, context, chosen, margin):
    r = row(data)
    assert detect_preference_format(r) == fmt
    pair = pair_from_row(r)
    assert pair.context == context
    assert pair.chosen == chosen
    assert pair.rejected == BAD
    assert pair.margin == margin


CTX = {"conversations": [{"from": "human", "value": "Hi"}]}


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({**CTX, "rejected": "no"}, r"prefs.jsonl:line 7: field `chosen`: missing"),
        ({**CTX, "chosen": "yes"}, r"prefs.jsonl:line 7: field `rejected`: missing"),
        ({**CTX, "chosen": 3, "rejected": "no"}, r"prefs.jsonl:line 7: field `chosen`: expected a string, a \{role"),
        ({**CTX, "chosen": [], "rejected": "no"}, r"field `chosen`: expected a string"),
        ({**CTX, "chosen": "yes", "rejected": {"role": "assistant"}}, r"field `rejected\[0\]`: missing `content`"),
        ({**CTX, "chosen": "yes", "rejected": {"from": "gpt", "value": 5}},
         r"field `rejected\[0\].value`: expected a string or a list of content parts, got int"),
        ({**CTX, "chosen": [{"role": "user", "content": "x"}], "rejected": "no"},
         r"field `chosen\[0\]`: a reply holds assistant \(and tool\) messages only, got role 'user'"),
        ({**CTX, "chosen": [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "{}"}],
          "rejected": "no"}, r"field `chosen`: a reply must begin and end with an assistant message"),
        ({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hey"}], "chosen": "yes",
          "rejected": "no"}, r"field `conversations`: wrong role order: .*'user' or 'tool', not 'assistant'"),
        ({"prompt": [{"role": "assistant", "content": "Hey"}], "chosen": "yes", "rejected": "no"},
         r"field `prompt\[0\].role`: wrong role order: 'assistant' cannot come first"),
        ({"prompt": 5, "chosen": "yes", "rejected": "no"},
         r"field `prompt`: expected a list of messages or a string, got int"),
        ({"chosen": "yes", "rejected": "no"}, r"prefs.jsonl:line 7: no context \(keys: \['chosen', 'rejected'\]\)"),
        ({**CTX, "chosen": "yes", "rejected": "no", "margin": "big"},
         r"field `margin`: expected a finite number .*got 'big'"),
        ({**CTX, "chosen": "yes", "rejected": "no", "margin": True}, r"field `margin`: expected a finite number"),
    ],
)
def test_bad_rows_name_file_line_and_field(data, match):
    with pytest.raises(DataError, match=match):
        pair_from_row(row(data))


def test_load_pairs_reads_mixed_formats_and_reports_the_bad_line(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{**CTX, "chosen": "yes", "rejected": "no"}, {"prompt": "Hi", "chosen": GOOD, "rejected": BAD, "margin": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n" + json.dumps({**CTX, "chosen": "yes"}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:line 4: field `rejected`: missing"):
        load_pairs([str(path)])
    pairs = load_pairs([str(path)], max_samples=2)
    assert [(p.row.line, p.margin) for p in pairs] == [(1, None), (2, 1.0)]


def test_a_reply_is_rendered_by_the_chat_template_and_located(tokenizer):
    context = [USER_HI]
    ids, start, end = encode_reply(tokenizer, context, GOOD)
    assert ids == tokenizer(render_text(tokenizer, context + GOOD), add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids[:start]) == render_text(tokenizer, context, add_generation_prompt=True)
    assert tokenizer.decode(ids[start:]) == "Hello! How can I help?<|im_end|>\n"
    assert tokenizer.decode(ids[start:end]) == "Hello! How can I help?<|im_end|>"  # not the newline after it


LONG_CONTEXT = [
    {"role": "system", "content": "Be kind."},
    {"role": "user", "content": "Tell me a long story about a dragon. " * 8},
    {"role": "assistant", "content": "Once upon a time there was a dragon who liked tea. " * 6},
    {"role": "user", "content": "And then?"},
]


def _reply_tokens(tokenizer, context, reply):
    ids, start, _ = encode_reply(tokenizer, context, reply)
    return ids[start:]


def test_long_context_loses_whole_early_turns_first_and_keeps_the_system_prompt(tokenizer):
    full_c = encode_reply(tokenizer, LONG_CONTEXT, GOOD)[0]
    short_context = [LONG_CONTEXT[0], LONG_CONTEXT[3]]
    short_c, short_r = encode_reply(tokenizer, short_context, GOOD)[0], encode_reply(tokenizer, short_context, BAD)[0]
    enc = encode_pair(tokenizer, LONG_CONTEXT, GOOD, BAD, max_length=len(full_c) - 1)
    assert enc.truncated
    assert (enc.chosen_ids, enc.rejected_ids) == (short_c, short_r)
    untouched = encode_pair(tokenizer, LONG_CONTEXT, GOOD, BAD, max_length=len(full_c))
    assert not untouched.truncated and untouched.chosen_ids == full_c


def test_a_too_long_last_turn_is_cut_from_the_left_with_both_replies_whole(tokenizer):
    context = [{"role": "user", "content": "Please summarise this text: " + "lorem ipsum dolor sit amet " * 30}]
    long_reply = [{"role": "assistant", "content": "It is placeholder text, repeated many times over."}]
    enc = encode_pair(tokenizer, context, long_reply, BAD, max_length=40)
    c_reply, r_reply = _reply_tokens(tokenizer, context, long_reply), _reply_tokens(tokenizer, context, BAD)
    assert enc.truncated
    assert len(enc.chosen_ids) == 40
    assert enc.chosen_ids[-len(c_reply):] == c_reply and enc.rejected_ids[-len(r_reply):] == r_reply
    # Both sides keep the same tail of the shared context.
    assert enc.chosen_ids[:-len(c_reply)] == enc.rejected_ids[:-len(r_reply)]


def test_pairs_whose_replies_cannot_fit_are_dropped_and_counted(tokenizer):
    short = pair_from_row(row({**CTX, "chosen": "Hello!", "rejected": "No.", "margin": 1}, line=1))
    long = pair_from_row(row({**CTX, "chosen": "word " * 60, "rejected": "No."}, line=2))
    multi = pair_from_row(row({"prompt": LONG_CONTEXT, "chosen": GOOD, "rejected": BAD}, line=3))
    records, stats, _ = encode_items(PREFERENCE_PAIRS, tokenizer, [short, long, multi], max_length=48)
    assert [(r["line"], r["margin"]) for r in records] == [(1, 1.0), (3, 0.0)]
    assert (stats.rows, stats.kept, stats.truncated, stats.dropped) == (3, 2, 1, 1)
    assert PREFERENCE_PAIRS.report("train", stats) == ("train: 3 pairs -> 2 kept (1 with their context truncated to max_seq_length, "
                                     "1 dropped: a reply does not fit in max_seq_length)")
    assert all(len(r["chosen_ids"]) <= 48 and len(r["rejected_ids"]) <= 48 for r in records)


def test_no_pair_fitting_is_an_error_naming_the_flag(tokenizer, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({**CTX, "chosen": "word " * 60, "rejected": "No."}) + "\n")
    args = TrainDataArguments(data_path=[str(path)], max_seq_length=16)
    with pytest.raises(DataError, match=r"train \(.*p.jsonl\): no pair fits in --max_seq_length 16; raise it"):
        build_preference_datasets(tokenizer, args)


# --------------------------------------------------------------------------- the dataset builder


def write_pairs(path, n: int, first: int = 0, long_reply_at: int | None = None) -> str:
    """n pairs, told apart by their question; the one at long_reply_at has a reply too long for 64 tokens."""
    rows = [{"prompt": f"Question {first + i}?", "chosen": "word " * 80 if i == long_reply_at else "Yes.",
             "rejected": "No."} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def lines(dataset) -> list[int]:
    return sorted(dataset["line"])


def _change_file(args, tokenizer, monkeypatch):
    write_pairs(Path(args.data_path[0]), 5)
    return args


def _change_template(args, tokenizer, monkeypatch):
    # A template comment renders nothing, so only the template's text changes.
    monkeypatch.setattr(tokenizer, "chat_template", "{# edited #}" + tokenizer.chat_template)
    return args


def _change_max_seq_length(args, tokenizer, monkeypatch):
    args.max_seq_length = 96
    return args


@pytest.mark.parametrize("change, from_cache", [
    (lambda args, tokenizer, monkeypatch: args, True),
    (_change_file, False),
    (_change_template, False),
    (_change_max_seq_length, False),
    (lambda args, tokenizer, monkeypatch: TrainDataArguments(**{**vars(args), "overwrite_cache": True}), False),
], ids=["same-inputs", "file-changed", "chat-template-changed", "max_seq_length-changed", "overwrite_cache"])
def test_the_second_build_comes_from_the_cache_unless_an_input_changed(tokenizer, tmp_path, monkeypatch, caplog,
                                                                         change, from_cache):
    args = TrainDataArguments(data_path=[write_pairs(tmp_path / "p.jsonl", 4)], max_seq_length=128)
    first, _ = build_preference_datasets(tokenizer, args)
    args = change(args, tokenizer, monkeypatch)
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        second, _ = build_preference_datasets(tokenizer, args)
    assert ("train: tokenized data from cache" in caplog.text) == from_cache
    # A cache hit reports what the first build did.
    assert f"train: {len(second)} pairs -> {len(second)} kept" in caplog.text
    if from_cache:
        assert second.to_list() == first.to_list()


def write_conversations(path, n: int) -> str:
    rows = [{"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": "Yes."}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("write, build, arguments", [
    (write_pairs, build_preference_datasets, TrainDataArguments),
    (write_conversations, build_sft_datasets, SFTDataArguments),
], ids=["preference", "sft"])
def test_max_samples_caps_the_training_rows_only(tokenizer, tmp_path, write, build, arguments):
    args = arguments(data_path=[write(tmp_path / "train.jsonl", 5)], eval_data_path=[write(tmp_path / "eval.jsonl", 4)],
                     max_samples=2)
    train, evaluation = build(tokenizer, args)
    assert lines(train) == [1, 2]
    assert lines(evaluation) == [1, 2, 3, 4]


def test_val_size_holds_out_pairs_of_the_capped_training_rows(tokenizer, tmp_path, cache):
    args = TrainDataArguments(data_path=[write_pairs(tmp_path / "p.jsonl", 12)], val_size=0.25, max_samples=8)
    train, evaluation = build_preference_datasets(tokenizer, args, seed=0)
    assert (len(train), len(evaluation)) == (6, 2)
    assert sorted(lines(train) + lines(evaluation)) == list(range(1, 9))
    again, _ = build_preference_datasets(tokenizer, args, seed=0)
    assert lines(again) == lines(train)  # the same seed holds out the same pairs
    # The split is an index in memory: the cached dataset's folder holds only what the first build wrote.
    (cached,) = (cache / "datasets" / "preference").iterdir()
    assert sorted(f.name for f in cached.iterdir()) == ["data-00000-of-00001.arrow", "dataset_info.json",
                                                        "encode_stats.json", "state.json"]


@pytest.mark.parametrize("long_reply_at, level", [(None, logging.INFO), (1, logging.WARNING)],
                         ids=["nothing-lost-info", "one-dropped-warning"])
def test_the_report_warns_only_when_pairs_are_dropped_or_truncated(tokenizer, tmp_path, caplog, long_reply_at, level):
    args = TrainDataArguments(data_path=[write_pairs(tmp_path / "p.jsonl", 3, long_reply_at=long_reply_at)],
                              max_seq_length=64)
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        build_preference_datasets(tokenizer, args)
    (record,) = [r for r in caplog.records if "pairs ->" in r.getMessage()]
    assert record.levelno == level
    kept = 3 if long_reply_at is None else 2
    assert record.getMessage().startswith(f"train: 3 pairs -> {kept} kept")


def test_a_split_that_leaves_no_training_pair_says_what_to_change(tokenizer, tmp_path):
    args = TrainDataArguments(data_path=[write_pairs(tmp_path / "p.jsonl", 1)], val_size=0.5)
    with pytest.raises(DataError, match=r"--val_size 0.5 of 1 training examples leaves none to train on"):
        build_preference_datasets(tokenizer, args)


OPENAI_PREFERENCE = {
    "input": {"messages": [{"role": "system", "content": "Be brief."}, USER_HI],
              "tools": [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}],
              "parallel_tool_calls": True},
    "preferred_output": GOOD, "non_preferred_output": BAD,
}


def test_openai_preference_rows_work_in_every_stage(tokenizer, tmp_path):
    """OpenAI's preference fine-tuning rows: reward/DPO take the two outputs, SFT trains the preferred one,
    PPO the input as its prompt; the tools in `input` reach the template in all three."""
    from tunesmith.data.formats import conversation_from_row
    from tunesmith.data.prompts import encode_prompt_record, prompt_from_row

    tokenizer = copy.deepcopy(tokenizer)
    apply_chat_template_override(tokenizer, "chatml_tools")  # SmolLM2's own template shows no tools
    r = row(OPENAI_PREFERENCE)
    assert detect_preference_format(r) == "openai"
    pair = pair_from_row(r)
    assert (pair.context, pair.chosen, pair.rejected) == ([{"role": "system", "content": "Be brief."}, USER_HI], GOOD, BAD)
    (record,) = PREFERENCE_PAIRS.encode_one(tokenizer, pair, max_length=None).records
    assert "get_time" in tokenizer.decode(record["chosen_ids"])
    conversation = conversation_from_row(r)
    assert conversation.messages == pair.context + GOOD and conversation.tools[0]["function"]["name"] == "get_time"
    prompt = prompt_from_row(r)
    assert prompt.messages == pair.context
    assert "get_time" in tokenizer.decode(encode_prompt_record(tokenizer, prompt, 4096).records[0]["input_ids"])


@pytest.mark.parametrize("data, message", [
    ({"input": {"messages": [USER_HI]}, "preferred_output": GOOD},
     r"prefs.jsonl:line 7: field `non_preferred_output`: missing \(an OpenAI preference row needs `input`"),
    ({"input": {"messages": [USER_HI]}, "preferred_output": GOOD, "non_preferred_output": [USER_HI]},
     r"field `non_preferred_output\[0\]`: a reply holds assistant \(and tool\) messages only"),
    ({"input": {"messages": [USER_HI], "tools": "{oops"}, "preferred_output": GOOD, "non_preferred_output": BAD},
     r"field `input.tools`: expected a list of function specs as JSON"),
])
def test_malformed_openai_preference_rows_are_named(data, message):
    with pytest.raises(DataError, match=message):
        PREFERENCE_PAIRS.encode_one(None, pair_from_row(row(data)), max_length=None)


def test_a_preference_reply_with_weight_zero_is_refused():
    data = {"prompt": "Hi", "chosen": [{"role": "assistant", "content": "Hello!", "loss_weight": 0}], "rejected": "No."}
    with pytest.raises(DataError, match=r"field `chosen\[0\]`: a preference reply is what the pair compares"):
        pair_from_row(row(data))


# --------------------------------------------------------------------------- where a reply ends

TEMPLATES = Path(__file__).parents[2] / "data" / "templates"
TRL_TEMPLATES = Path(trl.__file__).parent / "chat_templates"
# Phi-3.5's and Phi-4-mini's tokenizers: the role and end markers are special tokens, eos is <|endoftext|>.
PHI_SPECIAL = {"eos_token": "<|endoftext|>", "additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>",
                                                                          "<|end|>"]}
SYSTEM_2_PLUS_2 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
FOUR, FIVE = [{"role": "assistant", "content": "2+2 is 4."}], [{"role": "assistant", "content": "Five."}]


def with_template(tokenizer, template: Path | None, special: dict | None = None):
    tok = copy.deepcopy(tokenizer)
    if template:
        apply_chat_template_override(tok, str(template))
    if special:
        tok.add_special_tokens(special)
    return tok


def span_text(tok, ids: list[int], span: tuple[int, int]) -> str:
    return tok.decode(ids[span[0]:span[1]])


@pytest.mark.parametrize("template, closing", [("phi3_5.jinja", "<|end|>\n<|endoftext|>"),
                                               ("phi4_mini.jinja", "<|end|><|endoftext|>")])
def test_phi_replies_end_with_their_end_marker_not_the_closing_end_of_text(tokenizer, template, closing):
    """Phi prints `{{ eos_token }}` once, after the last turn: DPO scores each reply up to its `<|end|>`, as SFT
    trains it, while the reward model still reads the template's render whole, `<|endoftext|>` last, in
    training and in scoring alike (one encode_pair serves both)."""
    tok = with_template(tokenizer, TEMPLATES / template, PHI_SPECIAL)
    enc = encode_pair(tok, SYSTEM_2_PLUS_2, FOUR, FIVE, max_length=None)
    assert (span_text(tok, enc.chosen_ids, enc.chosen_span), span_text(tok, enc.rejected_ids, enc.rejected_span)) == (
        "2+2 is 4.<|end|>", "Five.<|end|>")
    assert enc.chosen_ids == tok(render_text(tok, SYSTEM_2_PLUS_2 + FOUR), add_special_tokens=False)["input_ids"]
    assert tok.decode(enc.chosen_ids).endswith("2+2 is 4." + closing)
    assert enc.chosen_ids[-1] == enc.rejected_ids[-1] == tok.eos_token_id
    # A context cut from the left keeps the same spans, shifted.
    cut = encode_pair(tok, SYSTEM_2_PLUS_2, FOUR, FIVE, max_length=len(enc.chosen_ids) - 3)
    assert cut.truncated and len(cut.chosen_ids) == len(enc.chosen_ids) - 3
    assert (span_text(tok, cut.chosen_ids, cut.chosen_span), span_text(tok, cut.rejected_ids, cut.rejected_span)) == (
        "2+2 is 4.<|end|>", "Five.<|end|>")


@pytest.mark.parametrize("template, special, reply", [
    (None, None, "2+2 is 4.<|im_end|>"),  # SmolLM2's own template (ChatML)
    ("llama3", None, "2+2 is 4.<|eot_id|>"),
    ("qwen2_5", None, "2+2 is 4.<|im_end|>"),
    ("gemma3", None, "2+2 is 4.<end_of_turn>"),
    ("gemma4.jinja", None, "2+2 is 4.<turn|>"),
    ("phi3_5.jinja", PHI_SPECIAL, "2+2 is 4.<|end|>"),
    ("phi4_mini.jinja", PHI_SPECIAL, "2+2 is 4.<|end|>"),
])
def test_a_reply_span_is_what_sft_trains_of_the_same_reply(tokenizer, template, special, reply):
    """One rule for where a reply ends: a pair's chosen span is the tokens SFT trains of the same conversation."""
    path = template and (TEMPLATES / template if template.endswith(".jinja") else TRL_TEMPLATES / f"{template}.jinja")
    tok = with_template(tokenizer, path, special)
    enc = encode_pair(tok, SYSTEM_2_PLUS_2, FOUR, FIVE, max_length=None)
    (sft,), _ = encode_examples(tok, SYSTEM_2_PLUS_2 + FOUR, train_on="last_assistant")
    assert sft.input_ids == enc.chosen_ids
    assert [k for k, label in enumerate(sft.labels) if label != IGNORE_INDEX] == list(range(*enc.chosen_span))
    assert span_text(tok, enc.chosen_ids, enc.chosen_span) == reply
