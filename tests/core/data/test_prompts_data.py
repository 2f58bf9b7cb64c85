"""RLHF prompt files: formats, errors that name file/line/field, encoding and left padding."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tunesmith.data.formats import DataError
from tunesmith.data.prompts import build_prompts, encode_prompts, left_pad, load_prompts
from tunesmith.data.template import encode_prompt
from tunesmith.hparams import PromptDataArguments


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Each test's own dataset cache."""
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_every_prompt_format_becomes_messages_ending_with_user(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "What is 2+2?"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        {"conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
                           {"from": "human", "value": "Q2"}]},
        {"prompt": [{"role": "user", "content": "list form"}]},
    ])
    prompts = load_prompts([path])
    assert [p.messages for p in prompts] == [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"}],
        [{"role": "user", "content": "list form"}],
    ]
    assert [p.row.line for p in prompts] == [1, 2, 3, 4]
    assert len(load_prompts([path], max_samples=2)) == 2


@pytest.mark.parametrize("row, match", [
    ({"text": "hello"}, r"p.jsonl:line 2: unknown prompt format \(keys: \['text'\]\)"),
    ({"prompt": "   "}, r"p.jsonl:line 2: field `prompt`: empty prompt"),
    ({"prompt": 3}, r"p.jsonl:line 2: field `prompt`: expected a string or a list .* got int"),
    ({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]},
     r"p.jsonl:line 2: field `messages`: wrong role order: .*'user'.*not 'assistant'"),
    ({"conversations": [{"from": "gpt", "value": "A"}]},
     r"p.jsonl:line 2: field `conversations\[0\].role`: wrong role order: 'assistant' cannot come first"),
    ({"messages": [{"role": "user"}]}, r"p.jsonl:line 2: field `messages\[0\]`: missing `content`"),
    ({"prompt": [{"role": "robot", "content": "x"}]}, r"p.jsonl:line 2: field `prompt\[0\].role`: unknown role 'robot'"),
    ({"messages": []}, r"p.jsonl:line 2: field `messages`: empty conversation"),
])
def test_bad_prompt_rows_name_file_line_and_field(tmp_path, row, match):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, row])
    with pytest.raises(DataError, match=match):
        load_prompts([path])


def test_empty_prompt_file_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"empty.jsonl: no rows found"):
        load_prompts([str(tmp_path / "empty.jsonl")])


def test_encode_uses_the_chat_template_and_fits_long_prompts_as_chat_does(tmp_path, tokenizer, caplog):
    """--max_prompt_length means one thing in every stage: the oldest whole turns leave a prompt that is too long
    (the system prompt and the last turn stay, as in chat); a prompt too long even then is dropped and counted."""
    system = {"role": "system", "content": "Be brief."}
    history = [{"role": "user", "content": "long " * 100}, {"role": "assistant", "content": "ok"}]
    rows = [{"prompt": "short"}, {"prompt": "long " * 200},
            {"messages": [system, *history, {"role": "user", "content": "And now?"}]}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    prompts = load_prompts([path])
    last_turn = [system, {"role": "user", "content": "And now?"}]
    limit = max(len(encode_prompt(tokenizer, prompts[0].messages)), len(encode_prompt(tokenizer, last_turn)))
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        kept = encode_prompts(tokenizer, prompts, max_length=limit)
    assert [p.row.line for p in kept] == [1, 3]
    assert list(kept[0].input_ids) == encode_prompt(tokenizer, prompts[0].messages)
    assert tokenizer.decode(kept[0].input_ids).endswith("<|im_start|>assistant\n")
    assert kept[1].messages == last_turn and list(kept[1].input_ids) == encode_prompt(tokenizer, last_turn)
    assert ("prompts: 3 prompts -> 2 kept (1 without their oldest turns, 1 dropped: the system prompt and last turn "
            "alone are longer than max_prompt_length)") in caplog.text
    with pytest.raises(DataError, match=r"p.jsonl\): every prompt's system prompt and last turn alone are longer "
                                        r"than --max_prompt_length 3 tokens"):
        encode_prompts(tokenizer, prompts, max_length=3)


def test_left_pad_puts_every_prompt_end_at_the_same_column():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == mask.dtype == torch.long


# --------------------------------------------------------------------------- build_prompts: the shared builder

ROWS = [
    {"prompt": "What is 2+2?", "id": 7},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi", "loss": False}]},
    {"conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"}]},
]


def test_the_second_build_comes_from_the_cache_unless_an_input_changed(tokenizer, tmp_path, monkeypatch, caplog):
    args = PromptDataArguments(data_path=[write_jsonl(tmp_path / "p.jsonl", ROWS)])

    def build() -> tuple[list, bool]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tunesmith"):
            prompts = build_prompts(tokenizer, args, "train")
        return prompts, "train: tokenized data from cache" in caplog.text

    first, cached = build()
    assert not cached
    # What the trainer gets is what reading and encoding in code gives: rows, messages and ids round-trip.
    assert first == encode_prompts(tokenizer, load_prompts(args.data_path), args.max_prompt_length)
    assert build() == (first, True)
    # A template comment renders nothing: only the template's text changes.
    monkeypatch.setattr(tokenizer, "chat_template", "{# edited #}" + tokenizer.chat_template)
    assert build() == (first, False)
    args.max_prompt_length = 256
    assert build() == (first, False)
    write_jsonl(tmp_path / "p.jsonl", [*ROWS, {"prompt": "One more?"}])
    prompts, cached = build()
    assert len(prompts) == 4 and not cached


def test_max_samples_caps_the_prompts(tokenizer, tmp_path):
    args = PromptDataArguments(data_path=[write_jsonl(tmp_path / "p.jsonl", ROWS)], max_samples=2)
    assert [p.row.line for p in build_prompts(tokenizer, args)] == [1, 2]


@pytest.mark.parametrize("long_prompt, level", [(False, logging.INFO), (True, logging.WARNING)],
                         ids=["nothing-dropped-info", "one-dropped-warning"])
def test_the_report_warns_only_when_prompts_are_dropped(tokenizer, tmp_path, caplog, long_prompt, level):
    rows = [*ROWS, {"prompt": "long " * 100 if long_prompt else "short"}]
    args = PromptDataArguments(data_path=[write_jsonl(tmp_path / "p.jsonl", rows)], max_prompt_length=64)
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        prompts = build_prompts(tokenizer, args, "eval")
    (record,) = [r for r in caplog.records if "prompts ->" in r.getMessage()]
    assert record.levelno == level
    assert record.getMessage().startswith(f"eval: 4 prompts -> {len(prompts)} kept")
    assert len(prompts) == (3 if long_prompt else 4)
