"""Anthropic HH transcripts and Dahoas rows (DeepSpeed-Chat's data), and Parquet / save_to_disk inputs."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.helpers.rows import POLITE, RUDE, write_jsonl
from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.dataset import encode_conversation_record
from tunesmith.data.formats import BadRows, load_conversations, read_rows
from tunesmith.data.preference import encode_pair_record, load_pairs
from tunesmith.data.prompts import load_prompts
from tunesmith.errors import DataError

# As Anthropic/hh-rlhf writes them: "\n\nHuman: " and "\n\nAssistant: " turns, a trailing space here and there.
HH = {
    "chosen": "\n\nHuman: What is 2 + 2?\n\nAssistant: It is 4. \n\nHuman: 用中文说一遍\n\nAssistant: 二加二等于四。",
    "rejected": "\n\nHuman: What is 2 + 2?\n\nAssistant: It is 4. \n\nHuman: 用中文说一遍\n\nAssistant: 不知道",
}
HH_CONTEXT = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."},
              {"role": "user", "content": "用中文说一遍"}]
# As Dahoas/full-hh-rlhf writes them: the prompt ends with "\n\nAssistant:", replies open with a space.
DAHOAS = {"prompt": "\n\nHuman: Name a colour.\n\nAssistant: Blue.\n\nHuman: 再来一个\n\nAssistant:",
          "response": " 红色。", "chosen": " 绿色。", "rejected": " No."}
DAHOAS_CONTEXT = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                  {"role": "user", "content": "再来一个"}]


@pytest.fixture
def hh_file(tmp_path):
    return write_jsonl(tmp_path / "hh.jsonl", [HH, DAHOAS])


def test_hh_and_dahoas_rows_read_into_exact_turns_for_each_stage(hh_file):
    sft = load_conversations([hh_file])
    assert sft[0].messages == HH_CONTEXT + [{"role": "assistant", "content": "二加二等于四。"}]
    # DeepSpeed-Chat's SFT trains get_prompt_and_chosen: the prompt and `chosen`, not `response`.
    assert sft[1].messages == DAHOAS_CONTEXT + [{"role": "assistant", "content": "绿色。"}]
    pairs = load_pairs([hh_file])
    assert (pairs[0].context, pairs[0].chosen, pairs[0].rejected) == (
        HH_CONTEXT, [{"role": "assistant", "content": "二加二等于四。"}], [{"role": "assistant", "content": "不知道"}])
    assert (pairs[1].context, pairs[1].chosen, pairs[1].rejected) == (
        DAHOAS_CONTEXT, [{"role": "assistant", "content": "绿色。"}], [{"role": "assistant", "content": "No."}])
    assert [p.messages for p in load_prompts([hh_file])] == [HH_CONTEXT, DAHOAS_CONTEXT]


def test_hh_quirks_text_markers_repeated_speakers_and_no_leading_blank_line(tmp_path):
    row = {"chosen": "Human: Say Human: twice\n\nHuman: please\n\nAssistant: Human: Human:\n",
           "rejected": "Human: Say Human: twice\n\nHuman: please\n\nAssistant: no"}
    (conversation,) = load_conversations([write_jsonl(tmp_path / "q.jsonl", [row])])
    assert conversation.messages == [{"role": "user", "content": "Say Human: twice\n\nplease"},
                                     {"role": "assistant", "content": "Human: Human:"}]


def test_sft_labels_train_only_the_assistant_text(tokenizer, hh_file):
    conversation = load_conversations([hh_file])[0]
    (record,) = encode_conversation_record(tokenizer, conversation, 512, "assistant").records
    trained = [i for i, label in zip(record["input_ids"], record["labels"], strict=True) if label != IGNORE_INDEX]
    text = tokenizer.decode(trained)
    assert text.replace("<|im_end|>", "|") == "It is 4.|二加二等于四。|"
    assert "What is" not in text and "用中文" not in text


def test_preference_pairs_share_the_prompt_and_differ_in_the_reply(tokenizer, hh_file):
    pair = load_pairs([hh_file])[0]
    (record,) = encode_pair_record(tokenizer, pair, None).records
    chosen, rejected = record["chosen_ids"], record["rejected_ids"]
    start = record["chosen_start"]
    assert start == record["rejected_start"] and chosen[:start] == rejected[:start]
    assert "用中文说一遍" in tokenizer.decode(chosen[:start]) and "It is 4." in tokenizer.decode(chosen[:start])
    assert tokenizer.decode(chosen[start:record["chosen_end"]]) == "二加二等于四。<|im_end|>"
    assert tokenizer.decode(rejected[start:record["rejected_end"]]) == "不知道<|im_end|>"


@pytest.mark.parametrize("row, field, problem", [
    ({"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "hello there"}, "rejected", "not an HH transcript"),
    ({"chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: bye", "rejected": "\n\nHuman: hi\n\nAssistant: x"},
     "chosen", "the transcript ends with a Human turn"),
    ({"chosen": "\n\nHuman: hi\n\nAssistant: ", "rejected": "\n\nHuman: hi\n\nAssistant: x"},
     "chosen", "the last Assistant reply is empty"),
    ({"chosen": "\n\nHuman: hi\n\nAssistant: a", "rejected": "\n\nHuman: HI\n\nAssistant: b"},
     "rejected", "differs from `chosen` at turn 1"),
    ({"prompt": "\n\nHuman: hi", "chosen": " a", "rejected": " b"}, "prompt", 'a prompt must end with "\\n\\nAssistant:"'),
    ({"prompt": "\n\nHuman: hi\n\nAssistant:", "chosen": "  ", "rejected": " b"}, "chosen", "empty reply"),
], ids=["no markers", "ends with Human", "empty reply", "prefixes differ", "dahoas open prompt", "dahoas empty"])
def test_malformed_rows_are_reported_with_file_line_and_field(tmp_path, row, field, problem):
    path = write_jsonl(tmp_path / "bad.jsonl", [HH, row])
    with pytest.raises(BadRows, match=re.escape(f"{path}:line 2: field `{field}`: {problem}")):
        load_pairs([path])


def test_malformed_transcripts_are_reported_by_sft_and_prompts_too(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [HH, {"chosen": "\n\nHuman: hi\n\nHuman: again"}])
    for load in (load_conversations, load_prompts):
        with pytest.raises(BadRows, match=re.escape(f"{path}:line 2: field `chosen`: the transcript ends with a "
                                                    "Human turn")):
            load([path])


def _tables(tmp_path, rows):
    import pandas as pd
    from datasets import Dataset

    frame = pd.DataFrame(rows)
    frame.to_parquet(tmp_path / "rows.parquet")
    Dataset.from_pandas(frame).save_to_disk(str(tmp_path / "saved"))
    return str(tmp_path / "rows.parquet"), str(tmp_path / "saved")


def test_parquet_and_save_to_disk_read_the_same_rows_as_jsonl(tmp_path, hh_file):
    rows = [HH, DAHOAS, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    jsonl = write_jsonl(tmp_path / "rows.jsonl", rows)
    for path in _tables(tmp_path, rows):
        assert [r.data for r in read_rows(path)] == [r.data for r in read_rows(jsonl)] == rows
        assert [c.messages for c in load_conversations([path])] == [c.messages for c in load_conversations([jsonl])]
        assert [r.where() for r in read_rows(path)] == [f"{path}:row {n}" for n in (1, 2, 3)]


def test_bad_rows_in_a_table_are_named_by_row(tmp_path):
    parquet, saved = _tables(tmp_path, [HH, {"chosen": "\n\nHuman: hi"}])
    for path in (parquet, saved):
        with pytest.raises(BadRows, match=re.escape(f"{path}:row 2: field `chosen`: the transcript ends with a Human")):
            load_conversations([path])


def test_folders_that_are_not_one_saved_dataset_are_refused_in_one_line(tmp_path):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list([HH])}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataError, match=re.escape(f"data file {tmp_path / 'dict'}: is a datasets DatasetDict folder; "
                                                  f"give one of its splits ({tmp_path / 'dict' / 'train'})")):
        list(read_rows(tmp_path / "dict"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match=re.escape("is a directory; give the JSON/JSONL/Parquet files in it, or a "
                                                  "datasets.save_to_disk folder")):
        list(read_rows(tmp_path / "plain"))
    (rows,) = [list(read_rows(tmp_path / "dict" / "train"))]
    assert [r.data for r in rows] == [HH]


def test_short_dpo_run_on_hh_transcripts_from_a_saved_dataset(tiny_model_dir, tmp_path):
    from datasets import Dataset

    from tunesmith.preference import command as dpo

    questions = ["What is 2 + 2?", "Capital of France?", "Can you help me?", "Say something nice."]
    rows = [{"chosen": f"\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: {q}\n\nAssistant: {POLITE[i % 3]}",
             "rejected": f"\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: {q}\n\nAssistant: {RUDE[i % 3]}"}
            for i, q in enumerate(questions)]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "train"))
    trainer = dpo.run([
        "--model_name_or_path", tiny_model_dir, "--data_path", str(tmp_path / "train"),
        "--output_dir", str(tmp_path / "dpo"), "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0",
        "--max_seq_length", "96", "--per_device_train_batch_size", "4", "--max_steps", "4",
        "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--logging_steps", "1", "--beta", "0.5",
        "--save_strategy", "no", "--report_to", "none", "--plot_loss", "false",
    ])
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 4
    assert logs[0]["loss"] == pytest.approx(math.log(2), abs=1e-3)
    assert logs[-1]["loss"] < logs[0]["loss"] and logs[-1]["margin"] > 0


def test_hh_rows_in_json_keep_their_text_exactly(tmp_path):
    # The file's own escapes: "\n\n" in JSON text is the blank line the markers need.
    path = tmp_path / "raw.jsonl"
    path.write_text('{"chosen": "\\n\\nHuman: a\\n\\nAssistant: b", "rejected": "\\n\\nHuman: a\\n\\nAssistant: c"}\n')
    assert json.loads(path.read_text())["chosen"].startswith("\n\nHuman:")
    (pair,) = load_pairs([str(path)])
    assert (pair.context, pair.chosen[0]["content"], pair.rejected[0]["content"]) == (
        [{"role": "user", "content": "a"}], "b", "c")


def test_short_sft_run_on_hh_transcripts_from_parquet_trains_the_assistant_turns(tiny_model_dir, tmp_path):
    from tunesmith.sft.command import run as sft

    parquet, _ = _tables(tmp_path, [HH, DAHOAS] * 4)
    trainer = sft(["--model_name_or_path", tiny_model_dir, "--data_path", parquet, "--output_dir",
                   str(tmp_path / "sft"), "--max_seq_length", "128", "--report_to", "none", "--logging_steps", "1",
                   "--max_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
                   "--save_strategy", "no", "--plot_loss", "false", "--seed", "0"])
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 2 and all(math.isfinite(r["loss"]) for r in logs)
    assert trainer.state.log_history[0]["trained_tokens"] > 0


def test_prompts_from_a_saved_folder_are_cached_by_its_files(tokenizer, tmp_path, caplog, monkeypatch):
    import logging

    from datasets import Dataset

    from tunesmith.data.prompts import build_prompts
    from tunesmith.hparams import PromptDataArguments

    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))

    def build(rows) -> tuple[list, bool]:
        Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tunesmith"):
            prompts = build_prompts(tokenizer, PromptDataArguments(data_path=[str(tmp_path / "saved")]), "train")
        return [p.messages for p in prompts], "train: tokenized data from cache" in caplog.text

    assert build([HH]) == ([HH_CONTEXT], False)
    assert build([HH]) == ([HH_CONTEXT], True)
    changed = {"chosen": HH["chosen"].replace("2 + 2", "3 + 3"), "rejected": HH["rejected"]}
    messages, cached = build([changed])
    assert not cached and messages[0][0]["content"] == "What is 3 + 3?"
