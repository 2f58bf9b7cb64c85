"""Several files (--data_path a,b), mixed by --data_weights, and --data_split: DeepSpeed-Chat's split of one
dataset across SFT, reward/DPO and PPO. The parts depend only on the file, the split and the seed."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from tunesmith.data.dataset import build_datasets, build_sft_datasets
from tunesmith.data.formats import conversation_from_row, load_items
from tunesmith.data.mix import RowSelection, mixed_counts, split_bounds, split_part
from tunesmith.data.preference import PREFERENCE_PAIRS, pair_from_row
from tunesmith.data.prompts import build_prompts, prompt_from_row
from tunesmith.errors import ConfigError, DataError
from tunesmith.hparams import PromptDataArguments, SFTDataArguments, TrainDataArguments, parse_run


def hh_rows(n: int) -> list[dict]:
    return [{"chosen": f"\n\nHuman: question {i}?\n\nAssistant: good answer {i}.",
             "rejected": f"\n\nHuman: question {i}?\n\nAssistant: bad answer {i}."} for i in range(n)]


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def chat_rows(tag: str, n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"{tag} {i}?"}, {"role": "assistant", "content": f"{tag} {i}."}]}
            for i in range(n)]


STAGE_READERS = {1: conversation_from_row, 2: pair_from_row, 3: prompt_from_row}


def part_lines(path: str, part: int, seed: int, split=("2", "4", "4")) -> list[int]:
    """The lines of the rows a stage reads, parsed by that stage's own reader."""
    selection = RowSelection(list(split), part, seed=seed)
    items, _ = load_items([path], STAGE_READERS[part], selection=selection)
    return [item.row.line for item in items]


# --------------------------------------------------------------------------- flags


@pytest.mark.parametrize("kind, extra", [("sft", []), ("dpo", []), ("reward", []),
                                         ("ppo", ["--reward_funcs", "exact_answer", "--max_steps", "1"])])
def test_comma_separated_paths_and_numbers_in_every_training_stage(kind, extra):
    run = parse_run(kind, ["--data_path", "a.jsonl,b.jsonl", "c.jsonl", "--data_weights", "1,2", "3",
                           "--data_split", "2,4,4", *extra], check_paths=False)
    assert run.data.data_path == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert run.data.data_weights == ["1", "2", "3"] and run.data.data_split == ["2", "4", "4"]
    assert run.data.split_part == {"sft": 1, "dpo": 2, "reward": 2, "ppo": 3}[kind]


def test_comma_separated_paths_in_a_run_config_resolve_beside_it(tmp_path):
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "b.jsonl").write_text("{}\n")
    config = tmp_path / "run.yaml"
    config.write_text("data_path: a.jsonl,b.jsonl\ndata_split: [2, 4, 4]\n")
    run = parse_run("sft", [str(config)], check_paths=False)
    assert run.data.data_path == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    assert run.data.data_split == ["2", "4", "4"]


@pytest.mark.parametrize("kind, argv, message", [
    ("sft", ["--data_weights", "0.7"], r"^--data_weights has 1 values for 2 --data_path files: give one weight per file"),
    ("sft", ["--data_weights", "0.7,x"], r"^--data_weights 0.7,x: give a number >= 0 per --data_path file, not all 0"),
    ("sft", ["--data_weights", "1,-1"], r"^--data_weights 1,-1: give a number >= 0"),
    ("sft", ["--data_weights", "0,0"], r"^--data_weights 0,0: give a number >= 0 per --data_path file, not all 0"),
    ("sft", ["--data_split", "2,4"], r"^--data_split 2,4: give three numbers >= 0, not all 0, the shares of SFT, "
                                     r"reward/DPO and PPO \(e.g. --data_split 2,4,4\)"),
    ("sft", ["--data_split", "2,-4,4"], r"^--data_split 2,-4,4: give three numbers >= 0"),
    ("sft", ["--data_split", "0,0,0"], r"^--data_split 0,0,0: give three numbers >= 0, not all 0"),
    ("sft", ["--data_split", "two,4,4"], r"^--data_split two,4,4: give three numbers"),
    ("sft", ["--data_split", "0,5,5"], r"^--data_split 0,5,5 gives stage sft \(part 1\) no rows: give its part a share"),
    ("dpo", ["--data_split", "5,0,5"], r"^--data_split 5,0,5 gives stage reward/dpo \(part 2\) no rows"),
    ("ppo", ["--data_split", "5,5,0", "--reward_funcs", "exact_answer", "--max_steps", "1"],
     r"^--data_split 5,5,0 gives stage ppo \(part 3\) no rows"),
    ("score", ["--data_split", "2,4,4", "--output_jsonl", "x.jsonl"],
     r"^--data_split chooses the rows a training stage \(or inspect\) uses; this command reads its --data_path whole"),
    ("compare", ["--data_weights", "1,1", "--adapter_name_or_path", "a"], r"^--data_weights chooses the rows"),
])
def test_misuse_is_refused_in_one_line(kind, argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_run(kind, ["--data_path", "a.jsonl,b.jsonl", *argv], check_paths=False)


# --------------------------------------------------------------------------- --data_split


def test_split_matches_deepspeed_chat_boundaries_and_shuffle():
    assert split_bounds(1000, [2, 4, 4]) == [0, 200, 600, 1000]
    assert split_bounds(10, [1, 1, 1]) == [0, 4, 7, 10]  # the rounding error goes to the first part
    order = np.arange(1000)
    np.random.RandomState(1234).shuffle(order)  # DeepSpeed-Chat's get_shuffle_idx
    assert split_part(1000, [2, 4, 4], 2, 1234) == sorted(order[200:600].tolist())


def openai_preference_rows(n: int) -> list[dict]:
    return [{"input": {"messages": [{"role": "user", "content": f"question {i}?"}]},
             "preferred_output": [{"role": "assistant", "content": f"good answer {i}."}],
             "non_preferred_output": [{"role": "assistant", "content": f"bad answer {i}."}]} for i in range(n)]


@pytest.mark.parametrize("make_rows", [hh_rows, openai_preference_rows], ids=["hh", "openai-preference"])
def test_parts_are_disjoint_cover_the_file_and_are_the_same_in_every_stage(tmp_path, make_rows):
    """An HH row (or an OpenAI preference row) works in all three stages; each stage, reading with its own
    parser, gets its own part."""
    path = write(tmp_path / "rows.jsonl", make_rows(50))
    parts = {part: part_lines(path, part, seed=7) for part in (1, 2, 3)}
    assert [len(parts[p]) for p in (1, 2, 3)] == [10, 20, 20]
    assert sorted(parts[1] + parts[2] + parts[3]) == list(range(1, 51))
    for part, lines in parts.items():  # whichever stage computes the split, the parts are the same rows
        for reader in STAGE_READERS.values():
            selection = RowSelection(["2", "4", "4"], part, seed=7)
            assert [item.row.line for item in load_items([path], reader, selection=selection)[0]] == lines
    assert part_lines(path, 1, seed=8) != parts[1]  # another seed, another split
    assert part_lines(path, 1, seed=7) == parts[1]  # the same seed, the same split


def test_split_counts_bad_rows_so_boundaries_do_not_move(tmp_path):
    """The split is over the file's rows, bad ones included: a row one stage cannot read moves nothing."""
    rows = hh_rows(20)
    lines = [json.dumps(r) for r in rows]
    lines[3] = "{not json"
    path = tmp_path / "hh.jsonl"
    path.write_text("\n".join(lines) + "\n")
    selection = RowSelection(["1", "1", "0"], 1, seed=3)
    items, problems = load_items([str(path)], conversation_from_row, skip_bad_rows=True, selection=selection)
    expected = [i + 1 for i in split_part(20, [1, 1, 0], 1, 3)]
    assert [c.row.line for c in items] == [line for line in expected if line != 4]
    assert bool(problems) == (4 in expected)


def test_split_is_taken_before_max_samples_and_val_size(tokenizer, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / "hh.jsonl", hh_rows(40))
    args = SFTDataArguments(data_path=[path], data_split=["2,4,4"], max_samples=5, val_size=0.2)
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        train, held_out = build_sft_datasets(tokenizer, args, seed=11)
    part = [i + 1 for i in split_part(40, [2, 4, 4], 1, 11)]
    assert f"train: {path}: data split 2,4,4: stage sft uses part 1: 8 of 40 rows (seed 11)" in caplog.text
    assert len(train) + len(held_out) == 5
    assert sorted(list(train["line"]) + list(held_out["line"])) == part[:5]


def test_each_stage_builds_and_logs_its_part(tokenizer, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / "hh.jsonl", hh_rows(30))
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        sft, _ = build_sft_datasets(tokenizer, SFTDataArguments(data_path=[path], data_split=["2,4,4"]), seed=5)
        pairs, _ = build_datasets(PREFERENCE_PAIRS, tokenizer, TrainDataArguments(data_path=[path], data_split=["2,4,4"]),
                                  seed=5)
        prompts = build_prompts(tokenizer, PromptDataArguments(data_path=[path], data_split=["2,4,4"]), "train", seed=5)
    lines = [sorted(list(sft["line"])), sorted(list(pairs["line"])), sorted(p.row.line for p in prompts)]
    assert lines == [part_lines(path, part, seed=5) for part in (1, 2, 3)]
    assert "stage sft uses part 1: 6 of 30 rows" in caplog.text
    assert "stage reward/dpo uses part 2: 12 of 30 rows" in caplog.text
    assert "stage ppo uses part 3: 12 of 30 rows" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tunesmith"):  # a cache hit reports the split too
        build_sft_datasets(tokenizer, SFTDataArguments(data_path=[path], data_split=["2,4,4"]), seed=5)
        again, _ = build_sft_datasets(tokenizer, SFTDataArguments(data_path=[path], data_split=["2,4,4"]), seed=6)
    assert "tokenized data from cache" in caplog.text and "stage sft uses part 1: 6 of 30 rows (seed 5)" in caplog.text
    assert sorted(list(again["line"])) == part_lines(path, 1, seed=6) != lines[0]  # the seed is part of the cache key


def test_a_part_left_empty_by_a_small_file_is_named(tmp_path):
    path = write(tmp_path / "tiny.jsonl", hh_rows(2))
    with pytest.raises(DataError, match=r"tiny.jsonl: --data_split 1,0,9 leaves part 1 \(stage sft\) none of its 2 rows"):
        load_items([path], conversation_from_row, selection=RowSelection(["1", "0", "9"], 1))


# --------------------------------------------------------------------------- --data_weights


def test_mixed_counts_add_up_and_follow_the_weights():
    assert mixed_counts([100, 100], [0.7, 0.3], 200) == [140, 60]
    assert mixed_counts([5, 5], [1, 1], 7) == [4, 3]
    assert sum(mixed_counts([3, 9, 1], [0.2, 0.5, 0.3], 13)) == 13


def test_weights_draw_in_proportion_repeat_a_small_file_and_log_each_file(tmp_path):
    a = write(tmp_path / "a.jsonl", chat_rows("a", 10))
    b = write(tmp_path / "b.jsonl", chat_rows("b", 30))
    selection = RowSelection(weights=["3", "1"], seed=1)
    items, _ = load_items([a, b], conversation_from_row, selection=selection)
    sources = [c.row.path for c in items]
    assert sources.count(a) == 30 and sources.count(b) == 10  # 40 rows, 3:1
    from collections import Counter

    assert set(Counter(c.row.line for c in items if c.row.path == a).values()) == {3}  # every row of a, 3 times
    assert len({c.row.line for c in items if c.row.path == b}) == 10  # 10 distinct rows of b
    assert selection.notes == [f"{a}: 10 rows read, 30 used (--data_weights 3, some repeated)",
                               f"{b}: 30 rows read, 10 used (--data_weights 1)"]
    again, _ = load_items([a, b], conversation_from_row, selection=RowSelection(weights=["3", "1"], seed=1))
    assert [(c.row.path, c.row.line) for c in again] == [(c.row.path, c.row.line) for c in items]
    other, _ = load_items([a, b], conversation_from_row, selection=RowSelection(weights=["3", "1"], seed=2))
    assert [(c.row.path, c.row.line) for c in other] != [(c.row.path, c.row.line) for c in items]


def test_weights_with_max_samples_and_split(tokenizer, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    a = write(tmp_path / "a.jsonl", hh_rows(20))
    b = write(tmp_path / "b.jsonl", chat_rows("b", 20))
    args = SFTDataArguments(data_path=[f"{a},{b}"], data_weights=["1,1"], data_split=["1,1,0"], max_samples=8)
    with caplog.at_level(logging.INFO, logger="tunesmith"):
        train, _ = build_sft_datasets(tokenizer, args, seed=3)
    assert list(train["source"]).count(a) == 4 and list(train["source"]).count(b) == 4
    assert {line for s, line in zip(train["source"], train["line"]) if s == a} <= {
        i + 1 for i in split_part(20, [1, 1, 0], 1, 3)}
    assert f"{a}: data split 1,1,0: stage sft uses part 1: 10 of 20 rows" in caplog.text
    assert f"{a}: 10 rows read, 4 used (--data_weights 1)" in caplog.text


def test_inspect_shows_the_rows_sft_trains_on(tmp_path, default_model_path):
    from tunesmith.inspect.command import run as inspect_main

    path = write(tmp_path / "hh.jsonl", hh_rows(20))
    out = tmp_path / "encoded.jsonl"
    inspect_main(["--model_name_or_path", default_model_path, "--data_path", path, "--data_split", "2,4,4",
                  "--seed", "9", "--output_jsonl", str(out), "--show", "0"])
    lines = [json.loads(x)["line"] for x in out.read_text().splitlines()]
    assert lines == part_lines(path, 1, seed=9)


def test_repeated_rows_stay_on_one_side_of_val_size(tokenizer, tmp_path, monkeypatch):
    """A row drawn several times by --data_weights is trained or held out, never both."""
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    a = write(tmp_path / "a.jsonl", chat_rows("a", 4))
    b = write(tmp_path / "b.jsonl", chat_rows("b", 20))
    args = SFTDataArguments(data_path=[a, b], data_weights=["1,1"], val_size=0.25)
    train, held_out = build_sft_datasets(tokenizer, args, seed=0)
    assert len(train) + len(held_out) == 24 and len(held_out) >= 6
    trained = set(zip(train["source"], train["line"]))
    assert trained.isdisjoint(zip(held_out["source"], held_out["line"]))


def test_sft_and_dpo_runs_train_on_their_own_parts_of_one_hh_file(tiny_model_dir, tmp_path, monkeypatch):
    from tunesmith.preference import command as dpo
    from tunesmith.sft import command as sft

    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / "hh.jsonl", hh_rows(20))
    common = ["--model_name_or_path", tiny_model_dir, "--data_path", path, "--data_split", "2,4,4", "--seed", "3",
              "--max_seq_length", "96", "--per_device_train_batch_size", "2", "--max_steps", "1",
              "--save_strategy", "no", "--report_to", "none", "--plot_loss", "false"]
    sft_trainer = sft.run([*common, "--output_dir", str(tmp_path / "sft")])
    dpo_trainer = dpo.run([*common, "--output_dir", str(tmp_path / "dpo")])
    assert sorted(list(sft_trainer.train_dataset["line"])) == part_lines(path, 1, seed=3)
    assert sorted(list(dpo_trainer.train_dataset["line"])) == part_lines(path, 2, seed=3)


def test_val_size_holds_out_rows_of_a_json_array_on_one_line(tokenizer, tmp_path, monkeypatch):
    """Rows of a one-line JSON array share a line; each is still a row of its own for --val_size."""
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "one_line.json"
    path.write_text(json.dumps(chat_rows("q", 8)))
    train, held_out = build_sft_datasets(tokenizer, SFTDataArguments(data_path=[str(path)], val_size=0.25), seed=0)
    assert (len(train), len(held_out)) == (6, 2)
    assert sorted(list(train["array_index"]) + list(held_out["array_index"])) == list(range(1, 9))
