"""The rows of `tunesmith pt`: settings that cannot work, refused in one line after parsing and before anything loads
(the parser checks them after the core's rows, hparams/rules.py, for this command only)."""

from __future__ import annotations

from ..data.text_documents import BLANK_LINE, WHOLE_FILE
from ..hparams.rule_engine import Rule

RULES: list[Rule] = [
    Rule("pt_stride", ("data",), lambda a: not 0 <= a.data.stride < a.data.max_seq_length,
         "--stride {data.stride}: give a number of tokens from 0 to --max_seq_length - 1 ({data.max_seq_length} - 1): "
         "each piece must bring tokens the one before did not."),
    Rule("pt_cross_document_needs_packing", ("data",), lambda a: a.data.cross_document_attention and not a.data.packing,
         "--cross_document_attention joins a packed batch into one sequence: add --packing true (the default), or "
         "leave the flag out (padded rows hold one piece each)."),
    Rule("pt_data_split", ("data",), lambda a: bool(a.data.data_split),
         "--data_split shares one dataset among SFT, reward/DPO and PPO; continued pre-training reads its own text: "
         "drop it (--max_samples, --data_weights and --val_size choose among the rows)."),
    Rule("pt_text_column", ("data",), lambda a: not a.data.text_column,
         "--text_column is empty: name the field of your rows that holds the document (default text)."),
    Rule("pt_separator", ("data",), lambda a: not a.data.document_separator.strip(),
         f"--document_separator is empty: `{WHOLE_FILE}` (a .txt file is one document), `{BLANK_LINE}`, or the text "
         "of the line that stands between documents."),
]
