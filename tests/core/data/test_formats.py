"""Each data format reads into the same messages; bad rows name file, line and field."""

from __future__ import annotations

import json
import re

import pytest

from tunesmith.data.formats import DataError, load_conversations, read_rows

EXPECTED = [
    {"role": "system", "content": "Be kind."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return str(path)


def test_three_formats_read_alike(tmp_path):
    rows = [
        {"messages": EXPECTED},
        {"conversations": [{"from": "system", "value": "Be kind."}, {"from": "human", "value": "Hi"},
                           {"from": "gpt", "value": "Hello!"}]},
        {"instruction": "Hi", "input": "", "output": "Hello!", "system": "Be kind."},
    ]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    convs = load_conversations([path])
    assert [c.messages for c in convs] == [EXPECTED] * 3
    assert [c.row.line for c in convs] == [1, 2, 3]


def test_json_array_and_several_files_and_max_samples(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(json.dumps([{"messages": EXPECTED[1:]}] * 2))
    b = write_jsonl(tmp_path / "b.jsonl", [{"messages": EXPECTED}])
    convs = load_conversations([str(a), b])
    assert len(convs) == 3 and convs[2].row.path == b
    assert len(load_conversations([str(a), b], max_samples=2)) == 2


def test_alpaca_history(tmp_path):
    path = write_jsonl(tmp_path / "h.jsonl", [{"instruction": "q2", "output": "a2", "history": [["q1", "a1"]]}])
    (conv,) = load_conversations([path])
    assert [m["content"] for m in conv.messages] == ["q1", "a1", "q2", "a2"]


def test_loss_flag_is_kept(tmp_path):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "loss": False},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    (conv,) = load_conversations([write_jsonl(tmp_path / "f.jsonl", [{"messages": msgs}])])
    assert conv.messages[1]["loss"] is False and "loss" not in conv.messages[3]


def test_openai_reply_straight_after_the_system_prompt_is_read(tmp_path):
    msgs = [{"role": "system", "content": "Greet first."}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Welcome."}]
    (conv,) = load_conversations([write_jsonl(tmp_path / "o.jsonl", [{"messages": msgs}])])
    assert conv.messages == msgs


GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}


@pytest.mark.parametrize(
    "bad_row, message",
    [
        ({"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]},
         r"line 2: field `messages\[0\]`: missing `content`"),
        ({"messages": [{"role": "assistant", "content": "x"}]},
         r"line 2: field `messages\[0\].role`: wrong role order: 'assistant' cannot come first"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                       {"role": "assistant", "content": "c"}]},
         r"line 2: field `messages\[1\].role`: wrong role order: 'user' cannot come after 'user'"),
        ({"messages": [{"role": "user", "content": "a"}]},
         r"line 2: field `messages`: wrong role order: the last turn must be 'assistant', not 'user'"),
        ({"messages": []}, r"line 2: field `messages`: empty conversation"),
        ({"conversations": [{"from": "robot", "value": "a"}]},
         r"line 2: field `conversations\[0\].from`: unknown speaker 'robot'"),
        ({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]},
         r"line 2: field `messages\[0\].content`: expected a string or a list of content parts, got int"),
        ({"instruction": "q"}, r"line 2: field `output`: missing"),
        ({"text": "hello"}, r"line 2: unknown format"),
        ("{not json", r"line 2: not valid JSON"),
        ("[1, 2]", r"line 2: expected a JSON object, got list"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "loss": "no"}]},
         r"line 2: field `messages\[1\].loss`: expected true or false"),
    ],
    ids=["missing-field", "assistant-first", "two-users", "ends-with-user", "empty", "unknown-speaker",
         "not-string", "alpaca-missing-output", "unknown-format", "not-json", "not-object", "bad-loss-flag"],
)
def test_bad_rows_name_file_line_and_field(tmp_path, bad_row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD, bad_row])
    with pytest.raises(DataError, match=message) as err:
        load_conversations([path])
    assert str(err.value).startswith("1 bad row (fix them, or pass --skip_bad_rows") and f"\n  {path}:line 2: " in str(err.value)


def test_bad_json_array_names_row(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([GOOD, {"messages": []}]))
    with pytest.raises(DataError, match=rf"{path}:line 1 \(row 2\): field `messages`: empty conversation"):
        load_conversations([str(path)])


def _parquet(folder):
    (folder / "t.parquet").write_bytes(b"PAR1\0\0PAR1")
    return folder / "t.parquet"


def _file(folder, name, data: bytes):
    (folder / name).write_bytes(data)
    return folder / name


@pytest.mark.parametrize("make, problem", [
    (lambda d: d / "nope.jsonl", "no such file"),
    (lambda d: _file(d, "empty.jsonl", b""), "is empty (0 bytes)"),
    (lambda d: d, "is a directory"),
    (_parquet, "is not a readable Parquet file"),
], ids=["missing", "empty", "directory", "damaged parquet"])
def test_files_that_are_not_data_are_named(tmp_path, make, problem):
    # read_rows is also called on its own (score, compare, evaluation), after no rules table.
    path = make(tmp_path)
    with pytest.raises(DataError, match=re.escape(f"data file {path}: {problem}")):
        list(read_rows(path))


def test_not_utf8_names_file_line_and_byte(tmp_path):
    first = (json.dumps(GOOD) + "\n").encode()
    path = _file(tmp_path, "latin1.jsonl", first + json.dumps(GOOD).replace("Hello", "Café").encode("latin-1"))
    offset = len(first) + json.dumps(GOOD).index("Hello") + 3
    with pytest.raises(DataError, match=re.escape(f"{path}:line 2: not UTF-8 text: byte {offset} is 0xe9; save the "
                                                  "file as UTF-8")):
        list(read_rows(path))


def test_utf16_is_named_and_a_utf8_byte_order_mark_is_fine(tmp_path):
    line = json.dumps(GOOD) + "\n"
    with pytest.raises(DataError, match="line 1: not UTF-8 text \\(it looks like UTF-16\\): byte 0"):
        list(read_rows(_file(tmp_path, "utf16.jsonl", line.encode("utf-16"))))
    (row,) = read_rows(_file(tmp_path, "bom.jsonl", line.encode("utf-8-sig")))
    assert row.data == GOOD
