"""The settings of `tunesmith distill` beside the SFT run's own (the student is the run's model, its data SFT's
data, rendered, masked and packed as SFT does). The checks on their combinations are the rows of rules.py
beside this file, after the core's (hparams/rules.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ..hparams import FinetuningArguments, ModelArguments, SFTDataArguments, SFTTrainingArguments
from ..hparams.rollout_args import RolloutEngineArguments
from ..utils.paths import adapter_base_model, is_adapter_dir

# The divergence each --distill_loss names, as GKD's beta (arXiv 2306.13649, Eq. 1): 0 is KL(teacher || student),
# 1 is KL(student || teacher); jsd takes --beta.
LOSS_BETAS = {"forward_kl": 0.0, "reverse_kl": 1.0}


@dataclass
class DistillArguments:
    role: ClassVar[str] = "distill"
    _argument_group_name: ClassVar[str] = "distillation"

    teacher_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "The teacher: a local model directory, or an adapter directory (its base is then read "
                  "from adapter_config.json). It must share the student's vocabulary (the same tokenizer)."},
    )
    teacher_adapter_name_or_path: str | None = field(
        default=None, metadata={"help": "A LoRA adapter on the teacher's model (base + adapter as the teacher)."})
    teacher_dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={"help": "The teacher's weight dtype. auto: as the student's (--dtype), bfloat16 under --bf16."})
    teacher_quantization_bit: int | None = field(
        default=None, metadata={"help": "4 or 8: load the teacher with bitsandbytes (it is never trained)."})
    distill_loss: Literal["forward_kl", "reverse_kl", "jsd"] = field(
        default="forward_kl",
        metadata={"help": "The per-token divergence over the reply tokens. forward_kl: KL(teacher || student), "
                  "mass-covering (classic KD, Hinton et al.); reverse_kl: KL(student || teacher), mode-seeking; jsd: "
                  "GKD's generalized Jensen-Shannon divergence with --beta."},
    )
    beta: float = field(
        default=0.5,
        metadata={"help": "--distill_loss jsd only: the weight of the teacher in the mixture m = beta * teacher + "
                  "(1 - beta) * student, in [0, 1] (0 is forward KL, 1 reverse KL, as in TRL's GKD)."},
    )
    distill_temperature: float = field(
        default=1.0,
        metadata={"help": "Both models' logits are divided by it before the softmax (above 1 softens the "
                  "teacher's distribution, showing more of its ranking of the other tokens)."},
    )
    lmbda: float = field(
        default=0.0,
        metadata={"help": "GKD's on-policy share, in [0, 1]: the chance that an optimizer step trains on the "
                  "student's own replies (each example's last reply sampled again by the student, through the "
                  "generation engine, at --distill_temperature) instead of the data's; the teacher scores them "
                  "alike. 0: the data's replies only."},
    )
    on_policy_max_new_tokens: int = field(
        default=128, metadata={"help": "With --lmbda: the longest reply the student samples, in tokens."})
    sft_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of the SFT loss (cross-entropy of the data's reply tokens) added to the "
                  "divergence: loss = divergence + sft_weight * sft_loss. 0: distillation alone."},
    )

    def __post_init__(self) -> None:
        # An adapter directory given as the teacher is that adapter on its recorded base (as --model_name_or_path).
        if self.teacher_adapter_name_or_path is None and is_adapter_dir(self.teacher_model_name_or_path):
            self.teacher_adapter_name_or_path, self.teacher_model_name_or_path = self.teacher_model_name_or_path, None
        if is_adapter_dir(self.teacher_adapter_name_or_path) and self.teacher_model_name_or_path is None:
            self.teacher_model_name_or_path = adapter_base_model(self.teacher_adapter_name_or_path)

    @property
    def loss_beta(self) -> float:
        """GKD's beta of the chosen divergence."""
        return LOSS_BETAS.get(self.distill_loss, self.beta)


# The dataclasses `tunesmith distill` parses (hparams.parse_run('distill'), through hparams/run_kinds.FEATURE_RUNS), in the order tunesmith_config.json records them: SFT's, with the
# distillation settings before the Trainer's.
ARGUMENTS: tuple[type, ...] = (ModelArguments, SFTDataArguments, FinetuningArguments, DistillArguments,
                                       RolloutEngineArguments, SFTTrainingArguments)
