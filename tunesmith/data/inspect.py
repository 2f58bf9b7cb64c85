"""Which tokens of each example are trained, for people to read: the encoded rows as training would
see them, and the rendered text with every trained run of tokens marked. The command is
`tunesmith inspect` (recipes/inspect.py); `python -m tunesmith.data.inspect` still runs it."""

from __future__ import annotations

from typing import Any

from ..constants import IGNORE_INDEX
from ..hparams import SFTDataArguments
from .formats import load_conversations
from .template import encode_conversation, trained_token_count, truncate

TRAINED_ON, TRAINED_OFF = "\x1b[42;30m", "\x1b[0m"
PLAIN_ON, PLAIN_OFF = "⟦", "⟧"


def highlight_trained(tokenizer: Any, input_ids: list[int], labels: list[int], color: bool) -> str:
    """The rendered text with every trained run of tokens marked."""
    on, off = (TRAINED_ON, TRAINED_OFF) if color else (PLAIN_ON, PLAIN_OFF)
    pieces, run, trained = [], [], None
    for tok, lab in zip(input_ids, labels):
        is_trained = lab != IGNORE_INDEX
        if trained is not None and is_trained != trained:
            pieces.append((trained, run))
            run = []
        run.append(tok)
        trained = is_trained
    if run:
        pieces.append((trained, run))
    text = ""
    for is_trained, ids in pieces:
        chunk = tokenizer.decode(ids, skip_special_tokens=False)
        text += f"{on}{chunk}{off}" if is_trained else chunk
    return text


def inspect_rows(tokenizer: Any, data_args: SFTDataArguments) -> list[dict]:
    records = []
    for conv in load_conversations(data_args.data_path, data_args.max_samples):
        enc = truncate(encode_conversation(tokenizer, conv.messages, data_args.train_on), data_args.max_seq_length)
        record: dict[str, Any] = {"source": conv.row.path, "line": conv.row.line}
        if trained_token_count(enc.labels) == 0:
            record["dropped"] = True
        record.update(input_ids=enc.input_ids, labels=enc.labels)
        records.append(record)
    return records


if __name__ == "__main__":  # the old spelling of `tunesmith inspect`, kept for one release
    from ..recipes.inspect import main

    main()
