"""The settings of `tunesmith inspect`: the model's (its tokenizer and chat template) and SFT's data arguments (the
rows, their rendering, masking and truncation, as `tunesmith sft` reads them) are the core's; what to show and where
to write it, and how a text corpus (`tunesmith pt`'s) is cut into documents, are InspectArguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..hparams.data_args import SFTDataArguments
from ..hparams.model_args import ModelArguments


@dataclass
class InspectArguments:
    role: ClassVar[str] = "inspect"
    _argument_group_name: ClassVar[str] = "inspect"

    output_file: str | None = field(default=None, metadata={"help": "Write input_ids/labels per input row here."})
    show: int = field(default=5, metadata={"help": "How many examples to print (0: none, -1: all)."})
    color: str = field(default="auto", metadata={"help": "auto (when stdout is a terminal), always, never."})
    seed: int = field(default=42, metadata={"help": "The --seed of the training run to inspect: with --data_split or "
                                            "--data_weights, it chooses the same rows as that run."})
    text_column: str = field(
        default="text", metadata={"help": "A text corpus (continued pre-training, `tunesmith pt`): the field of its "
                                  "rows that holds the document, as pt's --text_column."})
    document_separator: str = field(
        default="file", metadata={"help": "A text corpus: how its .txt files are cut into documents, as pt's "
                                  "--document_separator (file, blank_line, or a separator line)."})


# The dataclasses `tunesmith inspect` parses.
ARGUMENTS: tuple[type, ...] = (ModelArguments, SFTDataArguments, InspectArguments)
