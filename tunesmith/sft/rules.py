"""The rows of `tunesmith sft`: settings that cannot work with what SFT alone does (--streaming, which reads, renders
and masks conversations as training takes them: data/streaming.py), refused in one line after parsing and before
anything loads. The parser checks them after the core's rows (hparams/rules.py) for this command only, so each reads
SFT's data and training arguments without a guard; the core's row refuses --streaming for every other command."""

from __future__ import annotations

from typing import Any

from ..hparams.rule_engine import Rule


def _whole_set_flag(data: Any) -> str | None:
    """The first data flag given that needs every row before training (which --streaming never holds), or None."""
    given = {"val_size": data.val_size > 0, "data_weights": data.data_weights, "data_split": data.data_split,
             "max_samples": data.max_samples is not None}
    return next((flag for flag, value in given.items() if value), None)


RULES: list[Rule] = [
    Rule("streaming_max_steps", ("data", "training"), lambda a: a.data.streaming and a.training.max_steps <= 0,
         "--streaming reads data of unknown length: give --max_steps N (optimizer steps; the stream starts over at "
         "the end of the data, a new epoch, until then)."),
    Rule("streaming_whole_set", ("data",),
         lambda a: a.data.streaming and _whole_set_flag(a.data) and {"flag": _whole_set_flag(a.data)},
         "--{flag} needs the whole data set before training and --streaming never holds it: drop --{flag} (held-out "
         "evaluation data goes in --eval_data_path; --max_steps bounds the run), or drop --streaming."),
    Rule("streaming_workers", ("data", "training"),
         lambda a: a.data.streaming and a.training.dataloader_num_workers > 0,
         "--dataloader_num_workers {training.dataloader_num_workers} with --streaming: the stream's place, which a "
         "checkpoint records, is in the training process; drop --dataloader_num_workers."),
    Rule("streaming_sequence_parallel", ("data", "training"),
         lambda a: a.data.streaming and a.training.sequence_parallel_size > 1,
         "--streaming with --sequence_parallel_size: each process reads rows of its own, and sequence parallelism "
         "needs the same row on the ranks of a group; drop one of them."),
]
