"""Datasets named by their Hugging Face Hub id (`--data_path org/name[:subset]:split`, `--data_revision`) load from
the Hugging Face cache offline, as a compute node loads them after `hf download --repo-type dataset org/name`, and go
through the readers, masks and checks of a local file. Nothing here touches the network: HF_HUB_OFFLINE is set
(conftest) and the cache is a folder of this test's, laid out as huggingface_hub lays it out (checked with its own
scan_cache_dir)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers.rows import write_jsonl
from tunesmith.data.dataset import SFT_CONVERSATIONS, build_dataset
from tunesmith.data.streaming import StreamedExamples
from tunesmith.errors import ConfigError, PathError
from tunesmith.hparams import SFTDataArguments, parse_run
from tunesmith.utils.hub_data import HubDataset

ROOT = Path(__file__).resolve().parents[3]
CHAT_SHA, PREFS_SHA, CORPUS_SHA = "1" * 40, "2" * 40, "3" * 40


def chat_row(k: int) -> dict:
    """A row as HuggingFaceH4/ultrachat_200k holds them: prompt, prompt_id and the OpenAI messages."""
    question = f"What is {k} plus {k}?"
    return {"prompt": question, "prompt_id": f"id{k}", "messages": [
        {"role": "user", "content": question}, {"role": "assistant", "content": f"{k} plus {k} is {2 * k}."}]}


CHAT_TRAIN = [[chat_row(k) for k in range(0, 5)], [chat_row(k) for k in range(5, 9)]]  # two shards
CHAT_TEST = [chat_row(k) for k in range(100, 103)]
PAIRS = {split: [{"prompt": f"Say hello {k}", "chosen": f"Hello {k}! Nice to meet you.", "rejected": "No."}
                 for k in range(n)] for split, n in (("train", 6), ("test", 2))}
DOCS = {"en": ["The quick brown fox jumps over the lazy dog.", "A second English document, a little longer."],
        "fr": ["Le renard brun saute par-dessus le chien."]}

# A dataset card as the Hub's datasets have them: subsets (configs) and their data_files in the YAML header.
CHAT_CARD = """---
configs:
- config_name: default
  data_files:
  - split: train_sft
    path: data/train_sft-*
  - split: test_sft
    path: data/test_sft-*
---
# A chat dataset
"""
CORPUS_CARD = """---
configs:
- config_name: en
  data_files: en/*.parquet
- config_name: fr
  data_files: fr/*.parquet
---
"""


def parquet_bytes(rows: list[dict]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def cache_dataset(cache: Path, repo: str, sha: str, files: dict[str, bytes], ref: str = "main") -> Path:
    """One dataset in a Hugging Face cache as huggingface_hub writes it: datasets--org--name/ with blobs/ (the
    contents, named by their hash), snapshots/<commit>/ (the repository's paths, relative links to the blobs)
    and refs/<branch> (the commit)."""
    repo_dir = cache / f"datasets--{repo.replace('/', '--')}"
    for path, content in files.items():
        digest = hashlib.sha256(content).hexdigest()
        blob = repo_dir / "blobs" / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = repo_dir / "snapshots" / sha / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / ref).write_text(sha)
    return repo_dir / "snapshots" / sha


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hf_home") / "hub"
    cache_dataset(cache, "org/chat", CHAT_SHA, {
        "README.md": CHAT_CARD.encode(),
        "data/train_sft-00000-of-00002.parquet": parquet_bytes(CHAT_TRAIN[0]),
        "data/train_sft-00001-of-00002.parquet": parquet_bytes(CHAT_TRAIN[1]),
        "data/test_sft-00000-of-00001.parquet": parquet_bytes(CHAT_TEST)})
    cache_dataset(cache, "org/prefs", PREFS_SHA, {  # no card: the splits are in the file names
        f"{split}.jsonl": jsonl_bytes(rows) for split, rows in PAIRS.items()})
    cache_dataset(cache, "org/corpus", CORPUS_SHA, {
        "README.md": CORPUS_CARD.encode(),
        **{f"{lang}/train-00000-of-00001.parquet": parquet_bytes([{"text": d} for d in docs])
           for lang, docs in DOCS.items()}}, ref="v1")
    return cache


@pytest.fixture(autouse=True)
def offline_hub(hub_cache, tmp_path, monkeypatch):
    """The test's cache as huggingface_hub's (HF_HUB_CACHE), offline; tunesmith's own cache in tmp_path."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "tunesmith_cache"))


def test_the_test_cache_is_laid_out_as_huggingface_hub_lays_it_out(hub_cache):
    from huggingface_hub import scan_cache_dir, snapshot_download

    scan = scan_cache_dir(hub_cache)
    assert scan.warnings == []
    repos = {r.repo_id: r for r in scan.repos}
    assert set(repos) == {"org/chat", "org/prefs", "org/corpus"} and {r.repo_type for r in scan.repos} == {"dataset"}
    (chat,) = repos["org/chat"].revisions
    assert chat.commit_hash == CHAT_SHA and chat.refs == {"main"} and chat.nb_files == 4
    assert {f.file_name for f in chat.files} == {"README.md", "train_sft-00000-of-00002.parquet",
                                                 "train_sft-00001-of-00002.parquet", "test_sft-00000-of-00001.parquet"}
    assert next(iter(repos["org/corpus"].revisions)).refs == {"v1"}
    # and snapshot_download, offline, finds it by its id
    assert snapshot_download("org/chat", repo_type="dataset").endswith(f"snapshots/{CHAT_SHA}")


@pytest.mark.parametrize("text, parsed", [
    ("org/name", HubDataset("org/name")),
    ("org/name:train_sft", HubDataset("org/name", None, "train_sft")),
    ("org/name:main:test", HubDataset("org/name", "main", "test")),
    ("data/demo/sft.jsonl", None),  # more than one slash: a path
    ("./org/name", None),
    ("outputs/run", None),  # a folder results go to
    ("org/name:a:b:c", None),
    ("C:/data/x.jsonl", None),
])
def test_what_is_read_as_a_hub_id(text, parsed):
    assert HubDataset.parse(text) == parsed


def sft_data(*flags: str) -> SFTDataArguments:
    return parse_run("sft", ["--max_seq_length", "64", "--overwrite_cache", *flags]).data


def test_a_chat_dataset_by_its_id_is_its_split_read_as_local_files_are(tokenizer, tmp_path):
    data = sft_data("--data_path", "org/chat:train_sft", "--eval_data_path", "org/chat:test_sft")
    (train,), (test,) = data.data_path, data.eval_data_path
    assert test.endswith(f"snapshots/{CHAT_SHA}/data/test_sft-00000-of-00001.parquet")  # one file: the file itself
    assert sorted(os.listdir(train)) == ["00000-train_sft-00000-of-00002.parquet",  # two, beside the test split's:
                                         "00001-train_sft-00001-of-00002.parquet"]  # a folder of links, in order
    from_hub = build_dataset(SFT_CONVERSATIONS, tokenizer, [train], data).to_list()
    local = write_jsonl(tmp_path / "train.jsonl", CHAT_TRAIN[0] + CHAT_TRAIN[1])
    from_file = build_dataset(SFT_CONVERSATIONS, tokenizer, [local], data).to_list()
    assert len(from_hub) == 9
    assert [(r["input_ids"], r["labels"]) for r in from_hub] == [(r["input_ids"], r["labels"]) for r in from_file]
    assert sft_data("--data_path", "org/chat:train_sft").data_path == [train]  # the same folder, made once


def test_a_streamed_run_reads_a_hub_dataset_as_its_files(tokenizer):
    data = sft_data("--data_path", "org/chat:train_sft", "--streaming", "--max_steps", "3")
    expected = build_dataset(SFT_CONVERSATIONS, tokenizer, data.data_path, data).to_list()
    stream = StreamedExamples(SFT_CONVERSATIONS, tokenizer, data.data_path, SFTDataArguments(
        data_path=data.data_path, max_seq_length=64, shuffle_buffer=0))
    streamed = []
    for record in stream:
        if stream.state.position.epoch:
            break
        streamed.append(record)
    assert [r["input_ids"] for r in streamed] == [r["input_ids"] for r in expected] and len(streamed) == 9


def test_a_preference_dataset_splits_by_its_file_names(tokenizer, tmp_path):
    from tunesmith.data.preference import build_preference_datasets

    run = parse_run("dpo", ["--data_path", "org/prefs", "--eval_data_path", "org/prefs:test", "--overwrite_cache"])
    assert [Path(p).name for p in run.data.data_path + run.data.eval_data_path] == ["train.jsonl", "test.jsonl"]
    train, test = build_preference_datasets(tokenizer, run.data)
    assert (len(train), len(test)) == (6, 2)
    local = parse_run("dpo", ["--data_path", write_jsonl(tmp_path / "p.jsonl", PAIRS["train"]), "--overwrite_cache"])
    same = ("chosen_ids", "rejected_ids", "chosen_start", "chosen_end", "rejected_start", "rejected_end")
    assert [[r[k] for k in same] for r in train.to_list()] == [
        [r[k] for k in same] for r in build_preference_datasets(tokenizer, local.data)[0].to_list()]


def test_a_text_corpus_subset_at_a_revision_for_continued_pretraining(tokenizer, tmp_path):
    from tunesmith.pretrain.documents import text_kind

    args = parse_run("pt", ["--data_path", "org/corpus:en:train", "--data_revision", "v1", "--max_seq_length", "16",
                            "--overwrite_cache"]).data
    assert args.data_path[0].endswith(f"{CORPUS_SHA}/en/train-00000-of-00001.parquet")
    pieces = build_dataset(text_kind(args), tokenizer, args.data_path, args)
    expected = [t for d in DOCS["en"] for t in tokenizer(d)["input_ids"] + [tokenizer.eos_token_id]]
    assert [t for ids in pieces["input_ids"] for t in ids] == expected
    pinned = parse_run("pt", ["--data_path", "org/corpus:fr:train", "--data_revision", CORPUS_SHA]).data
    assert pinned.data_path[0].endswith(f"{CORPUS_SHA}/fr/train-00000-of-00001.parquet")  # a commit, offline


def test_inspect_shows_a_hub_dataset_by_its_id(tiny_model_dir, capsys):
    from tunesmith.inspect.command import run

    records = run(["--model_name_or_path", tiny_model_dir, "--data_path", "org/chat:train_sft", "--show", "1"])
    out = capsys.readouterr().out
    assert len(records) == 9 and "⟦0 plus 0 is 0.<|im_end|>⟧" in out and "9 rows, 0 bad" in out


@pytest.mark.parametrize("flags, message", [
    (["--data_path", "org/chat"], "--data_path org/chat: the dataset has no split 'train'; its splits: train_sft, "
                                  "test_sft (write org/chat:SPLIT)"),
    (["--data_path", "org/corpus", "--data_revision", "v1"],
     "--data_path org/corpus: the dataset has several subsets: en, fr; name one as org/corpus:SUBSET:SPLIT "
     "(e.g. org/corpus:en:train)"),
    (["--data_path", "org/corpus:de:train", "--data_revision", "v1"], "the dataset has no subset 'de': en, fr"),
    (["--data_path", "org/prefs:main:train"], "the dataset declares no subsets; write org/prefs:SPLIT"),
    (["--data_path", "org/corpus:en:train"], "the dataset org/corpus is not in the Hugging Face cache"),  # no main
    (["--data_path", "org/nothing"], "--data_path org/nothing: no such file here, and the dataset org/nothing is not "
                                     "in the Hugging Face cache"),
])
def test_what_cannot_be_found_is_refused_in_one_line(flags, message):
    with pytest.raises(PathError) as refused:
        sft_data(*flags)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_revision_without_a_hub_dataset_is_refused(tmp_path):
    local = write_jsonl(tmp_path / "a.jsonl", CHAT_TEST)
    with pytest.raises(ConfigError, match=r"--data_revision v1 is the revision of a Hugging Face Hub dataset, and "
                                          r"--data_path names none"):
        sft_data("--data_path", local, "--data_revision", "v1")


def test_a_name_neither_here_nor_in_the_cache_stops_the_command_in_one_line(capsys):
    from tunesmith.inspect.command import main

    with pytest.raises(SystemExit) as stopped:
        main(["--data_path", "nobody/nothing:train"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tunesmith: ")
    assert "--data_path nobody/nothing:train: no such file here, and the dataset nobody/nothing is not in the Hugging " \
           "Face cache" in err and "HF_HUB_OFFLINE is set" in err


@pytest.mark.heavy  # a fresh process (about 10 s on an idle machine, 50 s on a busy one)
def test_hf_home_and_hf_hub_offline_from_the_environment_decide_where_the_command_looks(tmp_path, hub_cache,
                                                                                        tiny_model_dir):
    """python -m tunesmith inspect -> HF_HOME/hub, offline: a name not there stops in one line; one there loads."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HOME": str(hub_cache.parent),
           "TUNESMITH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-m", "tunesmith", "inspect", "--data_path", "nobody/nothing:train"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("tunesmith:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"is not in the Hugging Face cache ({hub_cache}) and HF_HUB_OFFLINE is set" in lines[0]
    done = subprocess.run([sys.executable, "-m", "tunesmith", "inspect", "--data_path", "org/chat:test_sft",
                           "--model_name_or_path", tiny_model_dir, "--show", "0"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0 and "3 rows, 0 bad" in done.stdout, done.stderr
