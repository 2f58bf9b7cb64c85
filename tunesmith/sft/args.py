"""The settings of `tunesmith sft`: all of them the core's (hparams/), since continued pre-training, distillation and
the memory plan read the same data, finetuning and training arguments. Their combinations are refused by the core's
rows (hparams/rules.py) and by rules.py, the rows about what SFT alone does (--streaming)."""

from __future__ import annotations

from ..hparams.data_args import SFTDataArguments
from ..hparams.finetuning_args import FinetuningArguments, QATArguments
from ..hparams.model_args import ModelArguments
from ..hparams.training_args import SFTTrainingArguments

# The dataclasses `tunesmith sft` parses, in the order tunesmith_config.json records them.
ARGUMENTS: tuple[type, ...] = (ModelArguments, SFTDataArguments, FinetuningArguments, QATArguments,
                               SFTTrainingArguments)
