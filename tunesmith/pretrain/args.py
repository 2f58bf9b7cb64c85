"""The settings of `tunesmith pt`: the model's, the finetuning's and the training's are the core's (as SFT's); the
data's are PretrainDataArguments, raw text read and cut into pieces. Their combinations are refused by rules.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..data.text_documents import WHOLE_FILE
from ..hparams.data_args import TrainDataArguments
from ..hparams.finetuning_args import FinetuningArguments, QATArguments
from ..hparams.model_args import ModelArguments
from ..hparams.training_args import SFTTrainingArguments


@dataclass
class PretrainDataArguments(TrainDataArguments):
    """Raw text for continued pre-training: .txt files, or JSON/JSONL/Parquet rows with a text column. No chat
    template: each document is tokenized as it is, with the BOS/EOS the tokenizer adds, and every token trains."""

    data_path: list[str] = field(
        default_factory=list,
        metadata={"help": "One or more .txt files (cut into documents by --document_separator), or JSON/JSONL/Parquet "
                  "files, saved-dataset folders or folders of such shards with one document per row in "
                  "--text_column (space- or comma-separated: a.txt,b.jsonl; mixed by --data_weights)."},
    )
    max_seq_length: int = field(
        default=1024,
        metadata={"help": "Longest piece in tokens: a longer document is cut into pieces of at most this many "
                  "(--stride), none dropped."},
    )
    text_column: str = field(
        default="text",
        metadata={"help": "The field of a JSON/JSONL/Parquet row that holds its document (one document per row)."},
    )
    document_separator: str = field(
        default=WHOLE_FILE,
        metadata={"help": "How a .txt file is cut into documents: `file`, the whole file is one document (give "
                  "several .txt files for several); `blank_line`, a run of one or more blank lines "
                  "ends a document; any other value, a line holding exactly that text (e.g. `<|endoftext|>` or "
                  "`---`) stands between documents and is not part of either."},
    )
    add_eos: bool = field(
        default=True,
        metadata={"help": "End every document with the tokenizer's EOS token (unless its tokenizer already adds "
                  "one), so the model learns where a document stops, as LLaMA-Factory's and TRL's language-modelling "
                  "data do. The BOS token is the tokenizer's own choice."},
    )
    stride: int = field(
        default=0,
        metadata={"help": "A document longer than --max_seq_length is cut into pieces of at most that many tokens; "
                  "with a stride, each piece after the first starts this many tokens before the previous one "
                  "ended, and those repeated tokens are context only (not trained again), so every token trains "
                  "once and none starts without context. 0: pieces follow each other with no overlap."},
    )
    packing: bool = field(
        default=True,
        metadata={"help": "Pack a batch's pieces into one row with no padding. Each piece attends only within itself "
                  "(the same loss as each piece alone) unless --cross_document_attention. false: one padded row "
                  "per piece."},
    )
    cross_document_attention: bool = field(
        default=False,
        metadata={"help": "With --packing: a batch's pieces become one causal sequence, each token attending to every "
                  "token before it, across documents (what HF's run_clm, LLaMA-Factory's pt stage and axolotl do by "
                  "default), and the first token of each piece is predicted from the piece before it. Default: "
                  "attention within each piece only, exact and cheaper (no attention across pieces to compute)."},
    )
    max_forward_tokens: int | None = field(
        default=None,
        metadata={"help": "With --packing: the most tokens one forward/backward holds (as `tunesmith sft`'s): a "
                  "packed batch over it runs as several forwards of whole pieces before one optimizer step. Default: "
                  "2048 on CPU; on a GPU sized from its free memory; 0: the whole batch at once. With "
                  "--cross_document_attention a batch is one sequence, so one forward."},
    )


# The dataclasses `tunesmith pt` parses, in the order tunesmith_config.json records them.
ARGUMENTS: tuple[type, ...] = (ModelArguments, PretrainDataArguments, FinetuningArguments, QATArguments,
                               SFTTrainingArguments)
