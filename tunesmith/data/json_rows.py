"""The values of a JSON or JSONL data file, read with bounded memory: a JSONL file line by line (each line read
with readline(max_row_bytes + 1), so a line of 200 MB is refused after reading 64 MiB of it, not after holding
it and its parse), a JSON array element by element (the standard library's raw_decode on a window that grows
only while the element is unfinished and up to the bound), and one pretty-printed object whole when the file
fits the bound. JSON or JSONL is decided by the content, not the name. Each value comes with its line (and
its position in an array); a value that cannot be read comes as a DataError in its place where reading can
go on (JSONL), and is raised where it cannot (an array, text that is not UTF-8)."""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from ..errors import DataError
from ..hparams.data_args import DEFAULT_MAX_ROW_BYTES

Item = tuple[int, "int | None", Any]  # (line, 1-based array index or None, value or DataError)
CHUNK = 1 << 20  # bytes read at once from an array (doubled while one element is unfinished)
_BLANK = b" \t\r\n"
_SEPARATORS = re.compile(r"[ \t\r\n,]*")


def json_items(path: str, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[Item]:
    """(line, array index, parsed value or DataError) per row: the elements of a JSON array, one
    pretty-printed object, or the lines of JSONL; no row longer than max_row_bytes is held."""
    with open(path, "rb") as f:
        layout, start, whole = _layout(path, f, max_row_bytes)
        if layout == "array":
            yield from _array_items(path, f, max_row_bytes, start)
        elif layout == "object":
            yield whole
        else:
            yield from _lines(path, f, max_row_bytes, start)


def jsonl_start(path: str, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> int | None:
    """The byte offset of a JSONL file's first line (past a byte-order mark); None for a JSON array or one
    pretty-printed object."""
    with open(path, "rb") as f:
        layout, start, _ = _layout(path, f, max_row_bytes)
    return start if layout == "lines" else None


def jsonl_lines_from(path: str, offset: int, line: int,
                     max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> Iterator[tuple[Item, int]]:
    """The rows of a JSONL file from byte `offset`, where line `line + 1` starts, each with the offset of the line
    after it: a streamed run (data/streaming.py) records that offset and resumes there without reading what
    came before."""
    with open(path, "rb") as f:
        f.seek(offset)
        for item in _lines(path, f, max_row_bytes, offset, line):
            yield item, f.tell()


def _layout(path: str, f: BinaryIO, max_row_bytes: int) -> tuple[str, int, Item | None]:
    """("array" | "object" | "lines", the offset where the content starts, the one object when "object"); the
    file is left at that offset."""
    head = f.read(4)
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        raise DataError(f"{path}:line 1: not UTF-8 text (it looks like UTF-16): byte 0 is 0x{head[0]:02x}; "
                        "save the file as UTF-8")
    start = 3 if head.startswith(codecs.BOM_UTF8) else 0
    f.seek(start)
    first = _first_byte(f)
    f.seek(start)
    if first == b"[":
        return "array", start, None
    if first == b"{":
        whole = _one_object(path, f, max_row_bytes, start)
        f.seek(start)
        if whole is not None:
            return "object", start, whole
    return "lines", start, None


def _first_byte(f: BinaryIO) -> bytes:
    while chunk := f.read(CHUNK):
        stripped = chunk.lstrip(_BLANK)
        if stripped:
            return stripped[:1]
    return b""


def _too_long(path: str, line: int, max_row_bytes: int, index: int | None = None) -> DataError:
    row = f" (row {index})" if index else ""
    return DataError(f"{path}:line {line}{row}: the row is longer than --max_row_bytes {max_row_bytes} "
                     f"({max_row_bytes / 2**20:g} MiB): fix it (a file with no line breaks, a pasted dump?), or raise "
                     "--max_row_bytes")


def _decoded(path: str, raw: bytes, line: int, offset: int) -> str:
    """`raw` (read from byte `offset` of the file, on line `line`) as text."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad_line = line + raw.count(b"\n", 0, e.start)
        raise DataError(f"{path}:line {bad_line}: not UTF-8 text: byte {offset + e.start} is "
                        f"0x{raw[e.start]:02x}; save the file as UTF-8") from None


def _lines(path: str, f: BinaryIO, max_row_bytes: int, offset: int, lineno: int = 0) -> Iterator[Item]:
    """The rows of the lines after line `lineno`, read from byte `offset`. Each is yielded with the file at the
    start of the next line (f.tell() is where a streamed run resumes)."""
    while raw := f.readline(max_row_bytes + 1):
        lineno += 1
        if len(raw) > max_row_bytes and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # the rest of the line, read and dropped
                offset += len(raw)
                raw = f.readline(CHUNK)
            offset += len(raw)
            yield lineno, None, _too_long(path, lineno, max_row_bytes)
            continue
        text = _decoded(path, raw, lineno, offset)
        offset += len(raw)
        if not text.strip():
            continue
        try:
            yield lineno, None, json.loads(text)
        except json.JSONDecodeError as e:
            yield lineno, None, DataError(f"{path}:line {lineno}: not valid JSON ({e.msg} at column {e.colno})")


def _one_object(path: str, f: BinaryIO, max_row_bytes: int, offset: int) -> Item | None:
    """The file's one pretty-printed object, when its first line is no whole object and the file fits the bound;
    None for JSONL."""
    first = f.readline(max_row_bytes + 1)
    try:
        json.loads(first)
        return None  # a whole object on the first line: JSONL
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    if os.path.getsize(path) - offset > max_row_bytes:
        return None  # read as JSONL, whose lines then say what is wrong
    f.seek(offset)
    raw = f.read()
    text = _decoded(path, raw, 1, offset)
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return None
    body = text.lstrip()
    return text[: len(text) - len(body)].count("\n") + 1, None, whole


def _array_items(path: str, f: BinaryIO, max_row_bytes: int, offset: int) -> Iterator[Item]:
    """The elements of a JSON array, each parsed from a window of the file that holds it and at most
    max_row_bytes more: memory follows the longest element, not the file."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    window, pos, line, index, at_eof = "", 0, 1, 0, False

    def read_more(size: int) -> None:
        """Drop what is parsed (before pos), then add `size` more bytes of the file."""
        nonlocal window, pos, offset, at_eof
        raw = f.read(size)
        at_eof = not raw
        window, pos = window[pos:], 0
        try:
            window += utf8.decode(raw, final=at_eof)
        except UnicodeDecodeError as e:
            bad_line = line + window.count("\n") + raw.count(b"\n", 0, e.start)
            raise DataError(f"{path}:line {bad_line}: not UTF-8 text: byte {offset + e.start} is "
                            f"0x{raw[e.start]:02x}; save the file as UTF-8") from None
        offset += len(raw)

    def next_value() -> bool:
        """Past blanks and commas to the next value; False at the array's end."""
        nonlocal pos, line
        while True:
            found = _SEPARATORS.match(window, pos).end()
            line += window.count("\n", pos, found)
            pos = found
            if pos < len(window) or at_eof:
                return pos < len(window) and window[pos] != "]"
            read_more(CHUNK)

    next_value()
    pos += 1  # the "["
    while next_value():
        index += 1
        while True:
            try:
                item, end = decoder.raw_decode(window, pos)
                if end < len(window) or at_eof:  # something follows: not a number cut by the window's end
                    break
            except json.JSONDecodeError as e:
                if at_eof:  # an array cannot be resumed after a syntax error
                    raise DataError(f"{path}:line {line + window.count(chr(10), pos, e.pos)}: not valid JSON "
                                    f"({e.msg})") from None
            if len(window) - pos > max_row_bytes:
                raise _too_long(path, line, max_row_bytes, index)
            read_more(max(CHUNK, len(window) - pos))
        if end - pos > max_row_bytes:
            raise _too_long(path, line, max_row_bytes, index)
        yield line, index, item
        line += window.count("\n", pos, end)
        pos = end
