"""Which data to read and how long its sequences may be. The same flag means the same thing in every
stage: --data_path (one or more files, or Hugging Face Hub datasets: utils/hub_data.py), --data_weights (how many rows each gives), --data_split (one
dataset's parts for SFT, reward/DPO and PPO), --max_samples, --max_seq_length (prompt + reply tokens),
--max_prompt_length (prompt tokens, where only a prompt is read). A list flag takes its values
space-separated, comma-separated (`--data_path a.jsonl,b.jsonl`) or as a YAML list: comma_list reads
them all."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

# --data_split's three parts, in DeepSpeed-Chat's order: which stage trains on which.
SPLIT_STAGES = ("sft", "reward/dpo", "ppo")
LIST_FIELDS = ("data_path", "eval_data_path", "data_weights", "data_split")
# --max_row_bytes' default (data/formats.py reads with it where no flag is given): 64 MiB.
DEFAULT_MAX_ROW_BYTES = 64 * 2**20
# --shuffle_buffer's default with --streaming: examples held to shuffle the stream.
DEFAULT_SHUFFLE_BUFFER = 1000


def comma_list(values: str | Iterable[str] | None) -> list[str]:
    """The values of a list flag: each given value split at its commas, blanks dropped ("a,b" -> [a, b])."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [part.strip() for value in values for part in str(value).split(",") if part.strip()]


def numbers(values: list[str]) -> list[float] | None:
    """The values as numbers, or None when one is not a finite number."""
    try:
        out = [float(v) for v in values]
    except ValueError:
        return None
    return out if all(abs(x) != float("inf") and x == x for x in out) else None


@dataclass
class DataFileArguments:
    """The fields of every stage that reads data files."""

    role: ClassVar[str] = "data"
    _argument_group_name: ClassVar[str] = "data"
    result_neutral: ClassVar[frozenset[str]] = frozenset({"overwrite_cache", "max_row_bytes"})  # hparams/run_config.py
    # The part of --data_split this kind of run trains on (1 SFT, 2 reward/DPO, 3 PPO/GRPO/RLOO); 0: none.
    split_part: ClassVar[int] = 0

    data_path: list[str] = field(
        default_factory=list,
        metadata={"help": "One or more JSON/JSONL/Parquet files, saved-dataset folders, or folders of such files "
                  "(shards: *.jsonl, *.json, *.parquet, datasets' *.arrow, read in name order as one source), or "
                  "datasets on the Hugging Face Hub: org/name, org/name:split or org/name:subset:split (default: "
                  "the train split), fetched into the Hugging Face cache (HF_HOME; HF_TOKEN for gated ones; with "
                  "HF_HUB_OFFLINE=1 from the cache) (space- or comma-separated: a.jsonl,b.jsonl), the format "
                  "detected per row. Conversations: OpenAI "
                  "`messages`, ShareGPT `conversations` or Alpaca; preference pairs add `chosen`/`rejected`; "
                  "prompts (PPO, evaluation) are `prompt` strings or conversations ending with a user turn."},
    )
    data_weights: list[str] = field(
        default_factory=list,
        metadata={"help": "A mixing weight per --data_path file, in order (e.g. 0.7,0.3): the training rows are "
                  "drawn from each file in proportion to its weight, the total the files' rows together (or "
                  "--max_samples); a file asked for more rows than it has gives every row, repeated, then a "
                  "seeded sample (--seed). Default: every row of every file, in order."},
    )
    data_split: list[str] = field(
        default_factory=list,
        metadata={"help": "DeepSpeed-Chat's split of one dataset across the three stages, e.g. 2,4,4: each file's "
                  "rows are shuffled with --seed and cut in these proportions; SFT trains on part 1, the reward "
                  "model and DPO on part 2, PPO/GRPO/RLOO on part 3, so no stage sees another's rows. The parts "
                  "depend only on the file, the split and --seed; the part is taken before --data_weights, "
                  "--max_samples and --val_size. --eval_data_path is used whole."},
    )
    data_revision: str | None = field(
        default=None,
        metadata={"help": "The revision of the Hugging Face Hub datasets named in --data_path (and "
                  "--eval_data_path): a branch, tag or commit. Default: main."},
    )
    max_samples: int | None = field(
        default=None,
        metadata={"help": "Use only the first N rows of --data_path (quick runs; with --data_weights, N rows drawn "
                  "by weight). --eval_data_path files are used whole; --val_size holds out its share of these N."},
    )
    overwrite_cache: bool = field(
        default=False,
        metadata={"help": "Tokenize again even when the cache holds these files tokenized with the same tokenizer, "
                  "chat template and settings."},
    )
    max_row_bytes: int = field(
        default=DEFAULT_MAX_ROW_BYTES,
        metadata={"help": "The largest row a data file may hold, in bytes: a JSONL line, or one element of a JSON "
                  "array; a longer one is refused with its file and line as it is read, before it fills the "
                  "memory. The default, 64 MiB, holds a long-context conversation (a million tokens of text is "
                  "about 4 MB) with several pictures inlined as data: URLs; pictures given as paths cost only "
                  "their path. Parquet and saved-dataset rows are read by pyarrow, in batches, unbounded."},
    )
    skip_bad_rows: bool = field(
        default=False,
        metadata={"help": "Leave out rows that cannot be used (each reported as file:line: field: problem), count "
                  "them and list them in output_dir/<split>_bad_rows.txt. Default: every bad row is listed and "
                  "the run stops before training."},
    )

    def __post_init__(self) -> None:
        for name in LIST_FIELDS:
            if hasattr(self, name):
                setattr(self, name, comma_list(getattr(self, name)))


@dataclass
class DataArguments(DataFileArguments):
    max_seq_length: int = field(
        default=1024,
        metadata={"help": "Longest example in tokens (prompt + reply). Conversations keep whole exchanges "
                  "(--truncation); preference pairs lose early context first; what cannot fit is dropped and "
                  "counted."},
    )


@dataclass
class TrainDataArguments(DataArguments):
    split_part: ClassVar[int] = 2  # the reward model and DPO
    eval_data_path: list[str] = field(
        default_factory=list,
        metadata={"help": "Evaluation files, same formats as --data_path. Given (or --val_size), evaluation runs at "
                  "every checkpoint and once at the end (see --eval_strategy): SFT logs eval_loss and "
                  "eval_perplexity, the reward model and DPO eval_accuracy and eval_margin."},
    )
    val_size: float = field(
        default=0.0,
        metadata={"help": "Hold out this share of the --data_path examples (e.g. 0.1; the same ones for the same "
                  "--seed) and evaluate on them as on --eval_data_path (give one of the two). Formerly "
                  "--eval_split_ratio."},
    )
    streaming: bool = field(
        default=False,
        metadata={"help": "SFT: read, render and mask the --data_path rows (JSONL, Parquet, saved-dataset folders, "
                  "folders of shards) as training takes them, for data larger than the memory: nothing is tokenized up front or cached, "
                  "memory holds --shuffle_buffer examples and one row. Needs --max_steps (the stream starts over at "
                  "the end of the data); --val_size, --data_weights, --data_split and --max_samples need the whole "
                  "set and are refused (give --eval_data_path, read whole). Each process reads its own rows; a "
                  "resumed run continues at the example where it stopped. Costs: the tokenizing runs in the "
                  "training loop, every epoch, and the log has no up-front count of truncated or dropped examples."},
    )
    shuffle_buffer: int | None = field(
        default=None,
        metadata={"help": "With --streaming: how many examples are held to shuffle the stream (each step draws "
                  "at random among them, seeded by --seed, and the next example takes the drawn one's place). Larger "
                  "shuffles better and holds more examples in memory (and in each checkpoint); 0 trains in file "
                  "order. Default " + str(DEFAULT_SHUFFLE_BUFFER) + "."},
    )
    max_image_pixels: int = field(
        default=4096 * 4096,
        metadata={"help": "A vision-language model: the largest picture (width x height) a row may show; a larger "
                  "one is reported with its row (a scan at print resolution, a decompression bomb), since every "
                  "processor shrinks it anyway."},
    )


@dataclass
class SFTDataArguments(TrainDataArguments):
    split_part: ClassVar[int] = 1
    train_on: Literal["assistant", "last_assistant", "all"] = field(
        default="assistant",
        metadata={"help": "Which tokens are trained: every assistant reply and its end-of-turn token, only the "
                  "last reply, or everything (prompt included)."},
    )
    packing: bool = field(
        default=False,
        metadata={"help": "Pack several examples into one row with no attention between them (no padding)."},
    )
    max_forward_tokens: int | None = field(
        default=None,
        metadata={"help": "With --packing: the most tokens one forward/backward holds. A packed batch over it runs "
                  "as several forwards of whole examples before the one optimizer step (the same gradients, "
                  "summed), so activation memory follows this, not the batch size; each forward also reads every "
                  "weight, so much smaller values cost throughput. Default: 2048 on CPU; on a GPU as many as its free "
                  "memory holds at the model's bytes per token, measured on the first step and logged ('forwards of at "
                  "most N tokens'); under DeepSpeed (which steps at every backward) the whole batch at once. 0: the whole "
                  "batch at once."},
    )
    truncation: Literal["drop_turns", "drop_example", "cut"] = field(
        default="drop_turns",
        metadata={"help": "An example longer than --max_seq_length: drop_turns keeps the longest run of whole "
                  "exchanges that fits (ending after a reply's end-of-turn), else drops the example; "
                  "drop_example drops it; cut keeps the first max_seq_length tokens, even mid-reply. Dropped "
                  "and truncated examples are counted in the log."},
    )
    multi_turn: Literal["auto", "expand", "whole"] = field(
        default="auto",
        metadata={"help": "whole: one example per conversation, every reply trained in place; expand: one example "
                  "per trained reply, each the conversation up to it rendered as inference renders it; auto: "
                  "whole, or expand where the chat template renders earlier replies differently once more "
                  "turns follow (Qwen3's thinking blocks). Expansions are counted in the log."},
    )


@dataclass
class PromptDataArguments(DataFileArguments):
    split_part: ClassVar[int] = 3  # PPO, GRPO, RLOO
    max_prompt_length: int = field(
        default=512,
        metadata={"help": "Prompts longer than this many tokens (after the chat template) lose their oldest whole turns, "
                  "as chat's history does; one whose system prompt and last turn alone are longer is dropped, and "
                  "counted."},
    )
