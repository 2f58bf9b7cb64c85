"""Preference rows: both formats detected per row, errors naming file, line and field, rendering
through the SFT chat-template path, and truncation that keeps both replies."""

from __future__ import annotations

import json

import pytest

from tunesmith.data.formats import DataError, Row
from tunesmith.data.preference import (
    build_preference_datasets,
    detect_preference_format,
    encode_pair,
    encode_pairs,
    encode_reply,
    load_pairs,
    pair_from_row,
)
from tunesmith.data.template import render_text
from tunesmith.hparams import TrainDataArguments

USER_HI = {"role": "user", "content": "Hi"}
GOOD = [{"role": "assistant", "content": "Hello! How can I help?"}]
BAD = [{"role": "assistant", "content": "Go away."}]


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
         r"field `rejected\[0\].value`: expected a string, got int"),
        ({**CTX, "chosen": [{"role": "user", "content": "x"}], "rejected": "no"},
         r"field `chosen\[0\]`: a reply holds assistant \(and tool\) messages only, got role 'user'"),
        ({**CTX, "chosen": [{"role": "assistant", "content": "x"}, {"role": "tool", "content": "{}"}],
          "rejected": "no"}, r"field `chosen`: a reply must begin and end with an assistant message"),
        ({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hey"}], "chosen": "yes",
          "rejected": "no"}, r"field `conversations`: wrong role order: .*'user', not 'assistant'"),
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
    ids, start = encode_reply(tokenizer, context, GOOD)
    assert ids == tokenizer(render_text(tokenizer, context + GOOD), add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids[:start]) == render_text(tokenizer, context, add_generation_prompt=True)
    assert tokenizer.decode(ids[start:]) == "Hello! How can I help?<|im_end|>\n"


LONG_CONTEXT = [
    {"role": "system", "content": "Be kind."},
    {"role": "user", "content": "Tell me a long story about a dragon. " * 8},
    {"role": "assistant", "content": "Once upon a time there was a dragon who liked tea. " * 6},
    {"role": "user", "content": "And then?"},
]


def _reply_tokens(tokenizer, context, reply):
    ids, start = encode_reply(tokenizer, context, reply)
    return ids[start:]


def test_long_context_loses_whole_early_turns_first_and_keeps_the_system_prompt(tokenizer):
    full_c, _ = encode_reply(tokenizer, LONG_CONTEXT, GOOD)
    short_context = [LONG_CONTEXT[0], LONG_CONTEXT[3]]
    short_c, _ = encode_reply(tokenizer, short_context, GOOD)
    short_r, _ = encode_reply(tokenizer, short_context, BAD)
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
    records, stats = encode_pairs(tokenizer, [short, long, multi], max_length=48)
    assert [(r["line"], r["margin"]) for r in records] == [(1, 1.0), (3, 0.0)]
    assert (stats.rows, stats.kept, stats.truncated, stats.dropped_reply_too_long) == (3, 2, 1, 1)
    assert stats.report("train") == ("train: 3 pairs -> 2 kept (1 with their context truncated to max_seq_length, "
                                     "1 dropped: a reply does not fit in max_seq_length)")
    assert all(len(r["chosen_ids"]) <= 48 and len(r["rejected_ids"]) <= 48 for r in records)


def test_no_pair_fitting_is_an_error_naming_the_flag(tokenizer, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({**CTX, "chosen": "word " * 60, "rejected": "No."}) + "\n")
    args = TrainDataArguments(data_path=[str(path)], max_seq_length=16)
    with pytest.raises(ValueError, match=r"no pair fits in --max_seq_length 16; raise it"):
        build_preference_datasets(tokenizer, args)
