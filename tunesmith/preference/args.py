"""The preference feature's settings: DPOArguments (`tunesmith dpo`: DPO, IPO, SimPO, ORPO and KTO, one command,
--loss_type picks the loss), RewardArguments (`tunesmith reward`, the reward model) and ScoreArguments (`tunesmith
score`, scoring rows with a reward model). The rest comes from the core's dataclasses: the model from ModelArguments,
the pairs from TrainDataArguments (DataArguments for score), what trains from FinetuningArguments, and output_dir,
learning_rate, seed, batch sizes and deepspeed from TrainingArguments. The checks on their combinations are rows of
rules.py beside it (and the core's, hparams/rules.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..hparams.data_args import DataArguments, TrainDataArguments
from ..hparams.finetuning_args import FinetuningArguments
from ..hparams.model_args import ModelArguments
from ..hparams.training_args import TrainingArguments


@dataclass
class RewardArguments:
    role: ClassVar[str] = "reward"
    _argument_group_name: ClassVar[str] = "reward model"

    center_rewards_coefficient: float | None = field(
        default=None,
        metadata={"help": "Add this times mean((r_chosen + r_rejected)^2) to the loss, so scores stay centred on 0 "
                  "(0.01 is typical; off by default)."},
    )


# The DPO losses that compare the policy with a reference model.
REFERENCE_LOSSES = ("sigmoid", "ipo", "kto")


@dataclass
class DPOArguments:
    role: ClassVar[str] = "dpo"
    _argument_group_name: ClassVar[str] = "DPO"

    loss_type: Literal["sigmoid", "ipo", "simpo", "orpo", "kto"] = field(
        default="sigmoid",
        metadata={"help": "sigmoid: DPO against a reference (the model the run starts from: the adapter it continues, the base without its adapter, or with --finetuning_type full a frozen copy). ipo: IPO's squared loss "
                  "on length-averaged log-probs, against the reference. simpo: SimPO, reference-free, "
                  "length-normalised, with margin --simpo_gamma. orpo: ORPO, the chosen reply's NLL plus --beta times "
                  "an odds-ratio term, reference-free. kto: KTO (Ethayarajh et al. 2024, arXiv 2402.01306), against "
                  "the reference as sigmoid, on single replies each labelled desirable or undesirable (rows with "
                  "`label` true/false; a pair gives one of each), weighted by --desirable_weight and "
                  "--undesirable_weight; evaluated on held-out pairs (--eval_data_path)."},
    )
    beta: float = field(
        default=0.1,
        metadata={"help": "sigmoid/ipo/kto: how far from the reference the policy may move (smaller: further). simpo: "
                  "the reward scale. orpo: the weight (lambda) of the odds-ratio term beside the NLL."},
    )
    simpo_gamma: float = field(default=0.5,
                               metadata={"help": "SimPO's target margin between chosen and rejected rewards."})
    label_smoothing: float = field(
        default=0.0,
        metadata={"help": "sigmoid only: the assumed fraction of pairs whose labels are flipped (conservative DPO); "
                  "in [0, 0.5)."},
    )

    desirable_weight: float = field(
        default=1.0,
        metadata={"help": "kto: the weight (lambda_D) of the desirable replies' loss. The KTO paper advises "
                  "desirable_weight x desirable count / (undesirable_weight x undesirable count) in [1, 4/3]: with "
                  "fewer desirable replies, raise this one (the run warns when the data is outside that range)."},
    )
    undesirable_weight: float = field(
        default=1.0,
        metadata={"help": "kto: the weight (lambda_U) of the undesirable replies' loss; lower it where undesirable "
                  "replies outnumber desirable ones (see --desirable_weight)."},
    )

    precompute_ref_logps: bool = field(
        default=False,
        metadata={"help": "sigmoid/ipo: score every pair under the reference once, before training, instead of in "
                  "every step: one forward less per step, and with --finetuning_type full no frozen copy of the "
                  "model in memory. Not with ZeRO-3."},
    )

    @property
    def needs_reference(self) -> bool:
        return self.loss_type in REFERENCE_LOSSES


@dataclass
class ScoreArguments:
    role: ClassVar[str] = "score"
    _argument_group_name: ClassVar[str] = "scoring"

    output_file: str | None = field(
        default=None, metadata={"help": "Where to write one JSON line of scores per input row."}
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass."})


# Each command of the feature and its dataclasses, in the order tunesmith_config.json records them (hparams.run_kinds
# reads it): `tunesmith dpo` (ARGUMENTS, the feature's first), `tunesmith reward` and `tunesmith score`.
ARGUMENTS: tuple[type, ...] = (ModelArguments, TrainDataArguments, DPOArguments, FinetuningArguments, TrainingArguments)
ARGUMENTS_BY_KIND: dict[str, tuple[type, ...]] = {
    "dpo": ARGUMENTS,
    "reward": (ModelArguments, TrainDataArguments, RewardArguments, FinetuningArguments, TrainingArguments),
    "score": (ModelArguments, DataArguments, ScoreArguments),
}
