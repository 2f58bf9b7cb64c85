"""--streaming (data/streaming.py, train/streamed.py): the streamed examples are exactly the cached path's records,
from JSONL, Parquet and saved-dataset folders; the shuffle buffer is seeded and bounded; two ranks read disjoint
parts that cover the stream; a stream put back from its state continues where it stopped; a stopped-and-resumed
streamed run equals an uninterrupted one (losses and weights); the refusals, one line each."""

from __future__ import annotations

import itertools
import json
import os
import shutil

import pytest
from datasets import Dataset
from safetensors.torch import load_file

from tests.helpers.rows import write_jsonl
from tunesmith.data.dataset import SFT_CONVERSATIONS, build_dataset
from tunesmith.data.streaming import StreamedExamples
from tunesmith.errors import ConfigError, DataError, PathError
from tunesmith.hparams import SFTDataArguments, parse_run

TRAINED = ("input_ids", "labels", "source", "line", "array_index")


def conversation(k: int) -> dict:
    """Rows of three formats and lengths: some too long to keep (dropped), some cut to their first exchange."""
    if k % 3 == 0:
        return {"instruction": f"Add {k} and {k}.", "output": f"{k} plus {k} is {2 * k}."}
    if k % 3 == 1:
        return {"conversations": [{"from": "human", "value": f"Name number {k}."},
                                  {"from": "gpt", "value": f"Number {k}." + " And more." * (k % 9 == 4) * 40}]}
    return {"messages": [{"role": "user", "content": f"What is {k} squared?"},
                         {"role": "assistant", "content": f"{k * k}."},
                         {"role": "user", "content": "Thanks."},
                         {"role": "assistant", "content": "You're welcome." + " Really." * (k % 9 == 8) * 40}]}


ROWS = [conversation(k) for k in range(30)]


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict[str, str]:
    """The same rows as JSONL, as Parquet (three row groups) and as a datasets.save_to_disk folder."""
    folder = tmp_path_factory.mktemp("stream")
    jsonl = write_jsonl(folder / "rows.jsonl", ROWS)
    # tables hold columns: the same rows as OpenAI/ShareGPT/Alpaca columns, nulls where a format lacks a field
    rows = Dataset.from_json(jsonl, cache_dir=str(folder / "cache"))  # every row's columns (from_list: the first's)
    rows.to_parquet(str(folder / "rows.parquet"), batch_size=11)
    rows.save_to_disk(str(folder / "rows_saved"))
    # folders of shards, as large corpora come: Parquet files, and the Arrow files of a sharded save_to_disk
    (folder / "parquet_shards").mkdir()
    for k, start in enumerate(range(0, len(ROWS), 11)):
        rows.select(range(start, min(start + 11, len(ROWS)))).to_parquet(
            str(folder / "parquet_shards" / f"train-{k:05d}-of-00003.parquet"))
    rows.save_to_disk(str(folder / "sharded_save"), num_shards=3)
    (folder / "arrow_shards").mkdir()
    for shard in (folder / "sharded_save").glob("*.arrow"):
        shutil.copy(shard, folder / "arrow_shards" / shard.name)
    return {"jsonl": jsonl, "parquet": str(folder / "rows.parquet"), "saved": str(folder / "rows_saved"),
            "parquet_shards": str(folder / "parquet_shards"), "arrow_shards": str(folder / "arrow_shards")}


def data_args(path: str, **overrides) -> SFTDataArguments:
    return SFTDataArguments(data_path=[path], max_seq_length=64, **overrides)


def first_epoch(stream: StreamedExamples) -> list[dict]:
    """The examples the stream gives before it starts over (with no shuffle buffer: in file order)."""
    records = []
    for record in stream:
        records.append(record)
        if stream.state.position.epoch:
            return records[:-1]


def cached(tokenizer, path: str, **overrides) -> list[dict]:
    return build_dataset(SFT_CONVERSATIONS, tokenizer, [path], data_args(path, **overrides)).to_list()


KINDS = ["jsonl", "parquet", "saved", "parquet_shards", "arrow_shards"]


@pytest.mark.parametrize("kind", KINDS)
def test_streamed_examples_are_the_cached_records(tokenizer, data_files, kind):
    path = data_files[kind]
    expected = cached(tokenizer, path)
    assert len(expected) < len(ROWS)  # some dropped: no whole reply fits
    assert len({r["source"] for r in expected}) == (3 if kind.endswith("shards") else 1)  # named by their shard
    stream = StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], data_args(path, shuffle_buffer=0))
    streamed = first_epoch(stream)
    assert [{k: r[k] for k in TRAINED} for r in streamed] == [{k: r[k] for k in TRAINED} for r in expected]


def test_the_shuffle_buffer_is_seeded_and_draws_from_the_whole_buffer(tokenizer, data_files):
    path = data_files["jsonl"]

    def order(seed: int, buffer: int) -> list[tuple]:
        stream = StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], data_args(path, shuffle_buffer=buffer), seed)
        return [(r["line"], tuple(r["labels"])) for r in itertools.islice(stream, 40)]

    in_file_order = order(0, 0)
    assert order(0, 8) == order(0, 8) != in_file_order
    assert order(1, 8) != order(0, 8)
    # a buffer of 8 holds 8 examples: the first one given is among the first 9 read
    assert order(0, 8)[0] in in_file_order[:9]
    # data smaller than the buffer: it holds the whole first epoch, each example once, and gives it shuffled
    epoch = [(r["line"], tuple(r["labels"]))
             for r in first_epoch(StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path],
                                                   data_args(path, shuffle_buffer=0)))]
    given = order(0, 1000)[:len(epoch)]
    assert sorted(given) == sorted(epoch) and given != epoch


def test_two_ranks_read_disjoint_parts_that_cover_the_stream(tokenizer, data_files):
    path = data_files["jsonl"]
    every = first_epoch(StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], data_args(path, shuffle_buffer=0)))
    parts = [first_epoch(StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], data_args(path, shuffle_buffer=0),
                                          rank=rank, world_size=2)) for rank in (0, 1)]
    lines = [{r["line"] for r in part} for part in parts]
    assert lines[0] and lines[1] and not lines[0] & lines[1]
    assert sorted(map(json.dumps, parts[0] + parts[1])) == sorted(map(json.dumps, every))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("read, trained", [(37, 30), (26, 24)], ids=["next-epoch", "end-of-epoch"])
def test_a_stream_put_back_from_its_state_continues_where_it_stopped(tokenizer, data_files, kind, read, trained):
    """Read 37 examples of which 30 trained (the loader reads ahead), past the end of the first epoch's 27, or 26
    of which 24 while the buffer gives out the first epoch's last examples; a new stream given that state gives
    exactly what the uninterrupted one gives after its 30th (24th)."""
    path = data_files[kind]
    args = data_args(path, shuffle_buffer=5)
    straight = [r["input_ids"] for r in itertools.islice(StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], args),
                                                         80)]
    stopped = StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], args)
    stopped.lookahead = 10
    list(itertools.islice(stopped, read))
    state = json.loads(json.dumps(stopped.state_dict(consumed=trained)))  # as a checkpoint holds it
    resumed = StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], args)
    resumed.load_state_dict(state)
    assert [r["input_ids"] for r in itertools.islice(resumed, 80 - trained)] == straight[trained:]
    if kind == "jsonl" and read == 37:  # the reader starts at the saved byte offset, not at line 1
        assert state["position"]["offset"] > 0


def test_a_damaged_shard_is_refused_in_one_line_before_anything_loads(tmp_path):
    (tmp_path / "shards").mkdir()
    write_jsonl(tmp_path / "shards" / "a.jsonl", ROWS[:2])
    (tmp_path / "shards" / "b.parquet").write_bytes(b"PAR1\0\0PAR1")  # Parquet's magic bytes, but no footer
    with pytest.raises(PathError, match=rf"^data file {tmp_path / 'shards'}: its shard b.parquet is not a readable "
                                          r"Parquet file"):
        parse_run("sft", ["--data_path", str(tmp_path / "shards"), "--output_dir", str(tmp_path / "out")])


def test_a_stream_state_resumes_only_with_the_same_processes_and_files(tokenizer, data_files):
    path = data_files["jsonl"]
    stopped = StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], data_args(path), rank=0, world_size=2)
    stopped.lookahead = 4
    next(iter(stopped))
    state = stopped.state_dict(consumed=1)
    with pytest.raises(ConfigError, match=rf"^the checkpoint's stream was read by 2 process\(es\) from {path}: resume "
                                          r"with the same number of processes and --data_path"):
        StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], data_args(path)).load_state_dict(state)


def test_bad_rows_stop_the_stream_or_are_left_out_and_listed(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], {"messages": "not a list"}, ROWS[1]])
    stream = StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], data_args(path, shuffle_buffer=0))
    with pytest.raises(DataError, match=rf"1 bad row .*\n  {path}:line 2: field `messages`"):
        list(itertools.islice(stream, 3))
    stream = StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path],
                              data_args(path, shuffle_buffer=0, skip_bad_rows=True), report_dir=str(tmp_path / "out"))
    assert {r["line"] for r in itertools.islice(stream, 6)} == {1, 3}
    assert (tmp_path / "out" / "train_bad_rows.txt").read_text().startswith(f"{path}:line 2: field `messages`")


def test_a_stream_with_no_usable_example_stops_with_one_line(tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "long.jsonl", [{"messages": [{"role": "user", "content": "hi " * 200},
                                                               {"role": "assistant", "content": "yes " * 200}]}])
    stream = StreamedExamples(SFT_CONVERSATIONS, tokenizer, [path], data_args(path, shuffle_buffer=0))
    with pytest.raises(DataError, match=r"no example has a trained token within --max_seq_length 64"):
        next(iter(stream))


@pytest.mark.parametrize("kind, argv, message", [
    ("sft", ["--val_size", "0.1"], r"^--val_size needs the whole data set before training and --streaming never "
                                   r"holds it"),
    ("sft", ["--max_samples", "5"], r"^--max_samples needs the whole data set"),
    ("sft", ["--data_path", "a.jsonl,b.jsonl", "--data_weights", "1,2"], r"^--data_weights needs the whole data set"),
    ("sft", ["--data_split", "2,4,4"], r"^--data_split needs the whole data set"),
    ("sft", ["--max_steps", "-1"], r"^--streaming reads data of unknown length: give --max_steps N"),
    ("sft", ["--dataloader_num_workers", "2"], r"^--dataloader_num_workers 2 with --streaming"),
    ("sft", ["--shuffle_buffer", "-1"], r"^--shuffle_buffer must be 0 \(file order\) or more examples \(got -1\)"),
    ("dpo", [], r"^--streaming reads SFT conversations as training takes them \(tunesmith sft\)"),
    ("reward", [], r"^--streaming reads SFT conversations"),
    ("inspect", [], r"^--streaming reads SFT conversations"),
    ("pt", [], r"^--streaming reads SFT conversations"),
    # SFT's data, read whole: refused by their own features' rows (plan/rules.py, distill/rules.py)
    ("plan", [], r"^--streaming reads SFT conversations"),
    ("distill", ["--teacher_model_name_or_path", "teacher"], r"^--streaming reads SFT conversations"),
])
def test_what_streaming_cannot_do_is_refused_in_one_line(kind, argv, message):
    steps = ["--max_steps", "10"] if kind != "inspect" else []
    with pytest.raises(ConfigError, match=message):
        parse_run(kind, ["--data_path", "a.jsonl", "--streaming", "true", *steps, *argv], check_paths=False)


def test_a_shuffle_buffer_without_streaming_is_refused():
    with pytest.raises(ConfigError, match=r"^--shuffle_buffer 10 shuffles a --streaming run's examples"):
        parse_run("sft", ["--data_path", "a.jsonl", "--shuffle_buffer", "10"], check_paths=False)


def run_streamed(model_dir: str, data: str, out, *extra: str):
    from tunesmith.sft.command import run

    return run(["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), "--streaming", "true",
                "--shuffle_buffer", "6", "--max_seq_length", "64", "--per_device_train_batch_size", "2",
                "--learning_rate", "1e-2", "--lr_scheduler_type", "constant", "--lora_dropout", "0.0",
                "--plot_loss", "false", "--seed", "0", "--logging_steps", "1", *extra])


def test_a_resumed_streamed_run_equals_an_uninterrupted_one(tiny_model_dir, data_files, tmp_path, caplog,
                                                             monkeypatch):
    """Stopped after its step-3 checkpoint and run again, a streamed run trains steps 4-6 on the examples the
    uninterrupted run trains there, and its reader starts where the stopped one was, not at the file's start
    (the Trainer's own resume reads the stream again and drops what was trained): the same losses and the same
    adapter."""
    import tunesmith.data.streaming as streaming

    common = ("--max_steps", "6", "--save_strategy", "steps", "--save_steps", "3", "--packing", "true")
    straight = run_streamed(tiny_model_dir, data_files["jsonl"], tmp_path / "straight", *common)
    run_streamed(tiny_model_dir, data_files["jsonl"], tmp_path / "resumed", *common, "--max_steps", "3")
    starts = []  # the line each reader the resumed run opens starts after
    opened = streaming.rows_from
    monkeypatch.setattr(streaming, "rows_from", lambda path, position, *a: starts.append(position.line) or
                        opened(path, position, *a))
    caplog.set_level("INFO", logger="tunesmith")
    resumed = run_streamed(tiny_model_dir, data_files["jsonl"], tmp_path / "resumed", *common)
    assert any(m.startswith("train: the stream continues at") for m in caplog.messages)
    assert starts[0] >= 6  # 3 steps of 2 examples, and the 6 in the shuffle buffer, were read before the stop

    def losses(trainer) -> list[float]:
        return [r["loss"] for r in trainer.state.log_history if "loss" in r]

    assert len(losses(resumed)) == 6
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-5)
    weights = [load_file(str(tmp_path / run / "adapter_model.safetensors")) for run in ("straight", "resumed")]
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert tensor.allclose(weights[1][name], rtol=1e-5, atol=1e-7), name


# The training process, with its peak resident memory printed last (ru_maxrss: KiB on Linux).
PEAK_RSS_RUN = """
import json, resource, sys
from tunesmith.sft.command import run
run(sys.argv[1:])
print(json.dumps({"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def write_rows(path, megabytes: float) -> int:
    """A JSONL file of distinct conversations of about 1 kB each, `megabytes` in all; its size in bytes."""
    filler = "The answer comes with a long explanation. " * 20
    with open(path, "w", encoding="utf-8") as f:
        k = 0
        while f.tell() < megabytes * 2**20:
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Question {k}: {filler}"},
                                             {"role": "assistant", "content": f"Answer {k}."}]}) + "\n")
            k += 1
    return path.stat().st_size


def streamed_peak_rss(model_dir: str, data: str, out) -> int:
    """The peak resident memory, in bytes, of a 10-step --streaming run on `data`, in a process of its own."""
    import subprocess
    import sys

    argv = ["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), "--streaming", "true",
            "--max_steps", "10", "--per_device_train_batch_size", "2", "--max_seq_length", "512",
            "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none"]
    done = subprocess.run([sys.executable, "-c", PEAK_RSS_RUN, *argv], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_kib"] * 1024


@pytest.mark.heavy  # subprocesses over growing files (~1.7 min loaded); -m heavy
def test_peak_memory_is_flat_in_the_file_size(tiny_model_dir, tmp_path):
    """A streamed run of 10 steps on a 300 MB file peaks within 64 MiB of the same run on a 30 MB file: the file
    is never held, nor tokenized ahead of the steps (holding it would add more than the margin). About 40 s, most
    of it the two processes' start."""
    big = write_rows(tmp_path / "big.jsonl", 300)
    small = write_rows(tmp_path / "small.jsonl", 30)
    peaks = {name: streamed_peak_rss(tiny_model_dir, str(tmp_path / f"{name}.jsonl"), tmp_path / f"out_{name}")
             for name in ("small", "big")}
    print(f"peak RSS: {peaks['small'] / 2**20:.0f} MiB on {small / 2**20:.0f} MB, "
          f"{peaks['big'] / 2**20:.0f} MiB on {big / 2**20:.0f} MB")
    assert peaks["big"] - peaks["small"] < 64 * 2**20 < big - small


# Two launches (about 150 s on 2 busy cores): the opt-in tier, `bash scripts/test.sh -m heavy`; the
# default tier's test_two_ranks_read_disjoint_parts_that_cover_the_stream checks the ranks' parts without a launcher.
@pytest.mark.distributed
@pytest.mark.heavy
def test_two_ranks_stream_disjoint_rows_and_train_as_one_rank(tiny_model_dir, data_files, tmp_path):
    """Two ranks of one example each per step (torchrun, gloo, ZeRO-2) train the rows one rank trains two at a time:
    rank r reads rows r, r + 2, ... of the stream, so together they read each row once. (Ranks reading the same
    rows, or every rank the whole stream, would train other examples and log other losses.)"""
    from tests.system.test_distributed import ROOT, launch

    def streamed_losses(ranks: int, batch: int) -> list[float]:
        out = tmp_path / f"ranks{ranks}"
        launch("sft/train.py", ranks, "--model_name_or_path", tiny_model_dir, "--data_path", data_files["jsonl"],
               "--output_dir", str(out), "--streaming", "true", "--shuffle_buffer", "0", "--max_seq_length", "64",
               "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "4",
               "--per_device_train_batch_size", str(batch), "--learning_rate", "5e-3", "--lr_scheduler_type",
               "constant", "--lora_dropout", "0.0", "--plot_loss", "false", "--report_to", "none", "--seed", "0",
               "--deepspeed", str(ROOT / "configs/ds_zero2.json"))
        for rank in range(ranks):  # 4 steps of `batch` examples: the rows read, and which ones, per rank
            state = json.loads((out / "checkpoint-4" / f"stream_state_rank{rank}.json").read_text())
            assert state["yielded"] == 4 * batch and state["rank"] == rank and state["world_size"] == ranks
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        return [r["loss"] for r in history if "loss" in r]

    one, two = streamed_losses(1, 2), streamed_losses(2, 1)
    assert len(one) == 4 and two == pytest.approx(one, rel=2e-3)
