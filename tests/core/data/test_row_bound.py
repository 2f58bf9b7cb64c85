"""A row costs what the run can train of it (issue 64, item 4; data/row_bound.py, data/text_documents.py): a text
longer than --max_seq_length tokens can hold is shortened before it is tokenized, and the row is then cut or dropped
exactly as it was when tokenized whole (SFT's --truncation, a pair's and KTO's rule); a long `tunesmith pt` document
is tokenized in pieces cut where the tokenizer splits, its tokens those of the whole. The memory of one huge row of
each kind is measured (ru_maxrss) in a subprocess. The default model's tokenizer."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tunesmith.data.formats import Conversation, Row

WORDS = ["river", "Veloria", "blue", "stone", "amber", "harbour", "évidemment", "日本語", "don't", "42", "🙂", "—"]


def words(n: int, seed: int) -> str:
    """n words of mixed scripts, so that a text's head and tail tokenize differently."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + rng.choice(["", ",", ".", "\n"]) for _ in range(n))


def unbounded(monkeypatch):
    """Switch the bound off (each module's own name for it), to encode rows whole as before."""
    from tunesmith.data import dataset, preference

    whole = lambda tokenizer, messages, max_tokens, keep="head": (messages, [])  # noqa: E731
    monkeypatch.setattr(dataset, "bound_messages", whole)
    monkeypatch.setattr(preference, "bound_messages", whole)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


MAX = 64  # tokens: its character budget, (64 + 64) x 81 = 10,368 characters, is far below the texts below
HUGE = 4000  # words: about 25,000 characters

CONVERSATIONS = {
    "a huge first turn": [user(words(HUGE, 1)), assistant("Hi!")],
    "a huge later turn (drop_turns keeps the first exchange)": [user("Say hi."), assistant("Hi!"),
                                                                user(words(HUGE, 2)), assistant("Bye.")],
    "a huge reply (cut trains its first tokens)": [user("Tell me."), assistant(words(HUGE, 3))],
    "a huge system prompt": [{"role": "system", "content": words(HUGE, 4)}, user("Hi"), assistant("Hello.")],
    "a huge reasoning (SmolLM2's template shows none)": [user("Why?"), {**assistant("Because."), "reasoning_content": words(HUGE, 5)}],
}


@pytest.mark.parametrize("truncation", ["drop_turns", "drop_example", "cut"])
def test_a_huge_text_of_a_conversation_is_cut_or_dropped_as_when_it_was_tokenized_whole(tokenizer, monkeypatch,
                                                                                          caplog, truncation):
    from tunesmith.data.dataset import encode_conversation_record

    def encode(messages):
        conversation = Conversation(Row("data.jsonl", 7, {}), messages)
        encoded = encode_conversation_record(tokenizer, conversation, MAX, "assistant", truncation)
        return None if encoded is None else (encoded.records, encoded.truncated)

    with caplog.at_level("WARNING", logger="tunesmith.data.row_bound"):
        bounded = {name: encode(messages) for name, messages in CONVERSATIONS.items()}
    assert len(caplog.records) == len(CONVERSATIONS)  # one line a row, naming its file and line
    assert caplog.records[0].getMessage().startswith("data.jsonl:line 7: message 0's content: ")
    assert f"--truncation {truncation}" in caplog.records[0].getMessage()
    unbounded(monkeypatch)
    assert bounded == {name: encode(messages) for name, messages in CONVERSATIONS.items()}
    kept = [name for name, encoded in bounded.items() if encoded]  # the cases do show each rule at work
    later, reply, reasoning = (name for name in CONVERSATIONS if "later" in name or "reply" in name
                               or "reasoning" in name)
    assert kept == {"drop_turns": [later, reasoning], "drop_example": [reasoning],
                    "cut": [later, reply, reasoning]}[truncation]


def test_a_template_that_renders_a_cut_text_otherwise_gets_the_row_whole(tokenizer, monkeypatch, caplog):
    """A template that parses a message's text (here: prints its length first) would render the cut text otherwise:
    the row is then tokenized whole, as before, and the log line says so."""
    from tunesmith.data.dataset import encode_conversation_record

    monkeypatch.setattr(tokenizer, "chat_template", (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | length }}: {{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"))
    messages = [user("Tell me."), assistant(words(HUGE, 11))]
    conversation = Conversation(Row("data.jsonl", 3, {}), messages)
    with caplog.at_level("WARNING", logger="tunesmith.data.row_bound"):
        bounded = encode_conversation_record(tokenizer, conversation, MAX, "assistant", "cut")
    assert "kept whole: the chat template renders them cut otherwise" in caplog.records[0].getMessage()
    unbounded(monkeypatch)
    assert bounded.records and bounded.records == encode_conversation_record(tokenizer, conversation, MAX,
                                                                             "assistant", "cut").records


def test_a_text_within_the_budget_is_left_as_it_is(tokenizer):
    from tunesmith.data.row_bound import bound_messages, char_budget, chars_per_token

    assert chars_per_token(tokenizer) == 81  # SmolLM2's longest vocabulary string: a newline and 80 spaces
    messages = [user("x " * (char_budget(tokenizer, MAX) // 2)), assistant("Hi!")]
    assert bound_messages(tokenizer, messages, MAX) == (messages, [])
    long = [user("x" + messages[0]["content"]), assistant("Hi!")]
    bounded, notes = bound_messages(tokenizer, long, MAX)
    assert notes == [f"message 0's content: {len(long[0]['content']):,} characters"]
    kept = bounded[0]["content"]  # the head that holds MAX + 64 tokens, found in the budget's characters
    assert long[0]["content"].startswith(kept) and bounded[1] is long[1]
    assert len(tokenizer(kept, add_special_tokens=False)["input_ids"]) == MAX + 64
    assert bound_messages(tokenizer, long, None) == (long, [])  # no length limit (a reward score): nothing to bound


PAIRS = {
    "a huge last user turn (its tail kept)": ([user(words(HUGE, 6))], "Yes.", "No."),
    "a huge early turn (dropped with it)": ([user(words(HUGE, 7)), assistant("Hm."), user("And?")], "Yes.", "No."),
    "a huge system prompt": ([{"role": "system", "content": words(HUGE, 8)}, user("Hi")], "Hello.", "Go."),
    "a huge reply (dropped)": ([user("Tell me.")], words(HUGE, 9), "No."),
}


def test_a_huge_text_of_a_pair_or_a_judged_reply_is_cut_or_dropped_as_when_it_was_tokenized_whole(
        tokenizer, monkeypatch, caplog):
    from tunesmith.data.preference import PreferencePair, encode_pair_record
    from tunesmith.data.unpaired import JudgedReplies, encode_judged_record

    def encode():
        out = {}
        for name, (context, chosen, rejected) in PAIRS.items():
            row = Row("pairs.jsonl", 3, {})
            pair = encode_pair_record(tokenizer, PreferencePair(row, context, [assistant(chosen)],
                                                                [assistant(rejected)]), MAX)
            judged = encode_judged_record(tokenizer, JudgedReplies(row, context, [([assistant(chosen)], True),
                                                                                  ([assistant(rejected)], False)]), MAX)
            out[name] = [None if e is None else (e.records, e.truncated) for e in (pair, judged)]
        return out

    with caplog.at_level("WARNING", logger="tunesmith.data.row_bound"):
        bounded = encode()
    assert len(caplog.records) == 2 * len(PAIRS)
    assert caplog.records[-1].getMessage().startswith("pairs.jsonl:line 3: reply 0: message 0's content: ")
    unbounded(monkeypatch)
    assert bounded == encode()
    assert [name for name, (pair, _) in bounded.items() if pair] == ["a huge last user turn (its tail kept)",
                                                                     "a huge early turn (dropped with it)",
                                                                     "a huge system prompt"]


def test_a_long_document_tokenized_in_pieces_has_the_whole_documents_tokens(tokenizer):
    from tunesmith.data.text_documents import cut_into_pieces, document_ids, document_token_array, piece_cuts

    text = words(6000, 10).replace("river", "river  \n\n  ") + " " * 90 + "<|im_end|> end"
    whole = document_ids(tokenizer, text, piece_chars=None)
    naive = [t for k in range(0, len(text), 1000) for t in tokenizer(text[k:k + 1000])["input_ids"]]
    assert naive != whole  # a cut at a fixed place splits words and characters' bytes: the tokens differ
    for piece_chars in (7, 1000, 10_000):
        cuts = piece_cuts(tokenizer, text, piece_chars)
        assert len(cuts) >= len(text) // (piece_chars + 100) and all(text[c].isspace() for c in cuts)
        ids = document_token_array(tokenizer, text, piece_chars=piece_chars)
        assert isinstance(ids, np.ndarray) and ids.tolist() == whole
        pieces = cut_into_pieces(ids, 100, stride=10)
        assert [{k: v.tolist() for k, v in p.items()} for p in pieces] == cut_into_pieces(whole, 100, stride=10)
    assert document_ids(tokenizer, text) == whole


def test_records_of_arrays_make_the_dataset_their_lists_make():
    from datasets import Dataset

    from tunesmith.data.dataset import records_to_dataset

    ids = np.arange(40_000, 40_000 + 2500, dtype=np.int64)
    arrays = [{"input_ids": ids[k:k + 1000], "labels": ids[k:k + 1000], "source": "a.txt", "line": 1}
              for k in range(0, len(ids), 1000)]
    lists = [{key: v.tolist() if isinstance(v, np.ndarray) else v for key, v in r.items()} for r in arrays]
    ours, theirs = records_to_dataset(arrays), Dataset.from_list(lists)
    assert ours.features == theirs.features and ours.to_list() == theirs.to_list() == lists


MEASURE = r"""
import json, logging, resource, sys, time
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from transformers import AutoTokenizer
from tunesmith.data.dataset import SFT_CONVERSATIONS, build_dataset
from tunesmith.data.preference import PREFERENCE_PAIRS
from tunesmith.data.unpaired import JUDGED_REPLIES
from tunesmith.hparams import SFTDataArguments, TrainDataArguments
from tunesmith.pretrain.args import PretrainDataArguments
from tunesmith.pretrain.documents import text_kind
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
before, kept, seconds = peak_mb(), {}, {}
for kind, path in json.loads(sys.argv[2]).items():
    start = time.perf_counter()
    if kind == "pt":
        args = PretrainDataArguments(data_path=[path], max_seq_length=256, overwrite_cache=True)
        data = build_dataset(text_kind(args), tokenizer, args.data_path, args)
    else:
        args = (SFTDataArguments if kind == "sft" else TrainDataArguments)(data_path=[path], max_seq_length=256,
                                                                             overwrite_cache=True)
        data = build_dataset({"sft": SFT_CONVERSATIONS, "dpo": PREFERENCE_PAIRS, "kto": JUDGED_REPLIES}[kind],
                             tokenizer, args.data_path, args)
    kept[kind], seconds[kind] = len(data), round(time.perf_counter() - start, 1)
print(json.dumps({"peak_mb": peak_mb() - before, "kept": kept, "seconds": seconds}))
"""


def test_one_huge_row_of_each_kind_costs_what_the_run_can_train(tmp_path, tokenizer):
    """A 4 MB row (2,000,000 tokens of "x "), and a 1 MB pt document: tokenized whole, such a row took 1.1 GB (SFT,
    KTO) to 1.4 GB (DPO) and a 4 MB document 1.0 GB (benchmarks/row_bound.py before the bound: ru_maxrss over the
    process with its tokenizer, --max_seq_length 1024); bounded, the four kinds together stay under 150 MB
    (measured: 74 MB with a 2 MB document, whose tokens are its records: 8 bytes each, then Arrow's copy)."""
    huge = "x " * 2_000_000
    small = [user("Say hi."), assistant("Hi!")]
    rows = {"sft": [{"messages": small}, {"messages": [user(huge), assistant("Hi!")]}],
            "dpo": [{"prompt": "Say hi.", "chosen": "Hi!", "rejected": "No."},
                    {"prompt": huge, "chosen": "Hi!", "rejected": "No."}],
            "kto": [{"prompt": "Say hi.", "completion": "Hi!", "label": True},
                    {"prompt": huge, "completion": "Hi!", "label": False}]}
    paths = {}
    for kind, kind_rows in rows.items():
        paths[kind] = str(tmp_path / f"{kind}.jsonl")
        Path(paths[kind]).write_text("".join(json.dumps(r) + "\n" for r in kind_rows), encoding="utf-8")
    paths["pt"] = str(tmp_path / "doc.txt")
    Path(paths["pt"]).write_text(huge[:1_000_000], encoding="utf-8")  # 500,000 tokens: pieces, then records
    from tunesmith.data.text_documents import cut_into_pieces

    # "x " * n is n + c tokens (c from two small n), its EOS one more: that many tokens' pieces of 256.
    small_counts = [len(tokenizer("x " * n)["input_ids"]) for n in (1000, 2000)]
    assert small_counts[1] - small_counts[0] == 1000
    pieces = len(cut_into_pieces(np.zeros(small_counts[0] - 1000 + 500_000 + 1), 256))
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer.save_pretrained(tokenizer_dir)
    env = {**os.environ, "TUNESMITH_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(tokenizer_dir), json.dumps(paths)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["kept"] == {"sft": 1, "dpo": 2, "kto": 2, "pt": pieces}
    assert measured["peak_mb"] < 150, measured
    for kind in ("sft", "dpo", "kto"):
        assert f"{paths[kind]}:line 2: message 0's content: 4,000,000 characters" in done.stderr
