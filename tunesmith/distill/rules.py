"""The rows of `tunesmith distill`: settings that cannot work, about its teacher and its loss, refused in one line after
parsing and before anything loads (the parser checks them after the core's rows, hparams/rules.py, for this command
only)."""

from __future__ import annotations

import os
from typing import Any

from ..distributed import fsdp_requested, zero_stage
from ..errors import PathError
from ..hparams.rule_engine import Rule
from ..hparams.rule_helpers import (
    STREAMING_IS_SFTS,
    first_problem,
    missing_dir,
    problem_values,
    prompt_method,
    sequence_parallel_size,
    vision_folder,
)
from ..utils.paths import problem_with_model_dir
from ..utils.vocabulary import vocabulary_difference


def _teacher_vocabulary_differs(model: Any, distill: Any) -> dict | None:
    """{"teacher", "student", "difference"} when both models are local folders whose vocabularies differ."""
    student, teacher = model.model_name_or_path, distill.teacher_model_name_or_path
    if not (student and teacher and os.path.isdir(student) and os.path.isdir(teacher)):
        return None  # the default student is checked once its folder is known (distill/command.py)
    difference = vocabulary_difference((student, model.adapter_name_or_path),
                                       (teacher, distill.teacher_adapter_name_or_path))
    return {"teacher": teacher, "student": student, "difference": difference} if difference else None


def _teacher_dtype_overridden(distill: Any, training: Any) -> dict | None:
    """{"held": dtype} when ZeRO-3 would hold the teacher in another dtype than --teacher_dtype: transformers loads
    it inside deepspeed.zero.Init, which casts every weight to the DeepSpeed config's precision (bf16 with --bf16,
    fp16 with --fp16, else float32)."""
    if zero_stage(training) != 3 or distill.teacher_dtype == "auto":
        return None
    held = "bfloat16" if training.bf16 else "float16" if training.fp16 else "float32"
    return {"held": held} if distill.teacher_dtype != held else None


def _vision_student_or_teacher(a: Any) -> dict | None:
    """{"path", "problem"}: the student or the teacher that is a vision-language model (its type as the problem)."""
    return first_problem([p for p in (a.model.model_name_or_path, a.distill.teacher_model_name_or_path) if p],
                         vision_folder)


RULES: list[Rule] = [
    # SFT's data flags, read whole: --streaming is what `tunesmith sft` alone reads (the core refuses it elsewhere)
    Rule("distill_streaming", ("data", "distill"), lambda a: a.data.streaming, STREAMING_IS_SFTS),
    Rule("distill_teacher_given", ("distill",), lambda a: not a.distill.teacher_model_name_or_path,
         "--teacher_model_name_or_path is required: the model to distill from, a model folder or an adapter folder "
         "(e.g. outputs/sft_demo after the quickstart) that shares the student's tokenizer."),
    Rule("distill_teacher_path", ("distill",),
         lambda a: problem_values(problem_with_model_dir(a.distill.teacher_model_name_or_path)),
         "--teacher_model_name_or_path {distill.teacher_model_name_or_path}: {problem}; give a local model folder "
         "or an adapter folder.", PathError),
    Rule("distill_teacher_adapter_path", ("distill",), lambda a: missing_dir(a.distill.teacher_adapter_name_or_path),
         "--teacher_adapter_name_or_path {path}: {problem} (an adapter folder on the teacher's model).", PathError),
    Rule("distill_vocabulary", ("model", "distill"), lambda a: _teacher_vocabulary_differs(a.model, a.distill),
         "the teacher {teacher} and the student {student} do not share a vocabulary ({difference}): distillation "
         "compares their next-token distributions token by token; pick a teacher of the student's tokenizer (its "
         "model family and tokenizer version)."),
    Rule("distill_teacher_quantization", ("distill",), lambda a: a.distill.teacher_quantization_bit not in (None, 4, 8),
         "--teacher_quantization_bit must be 4 or 8 (got {distill.teacher_quantization_bit}); leave it out for the "
         "teacher's --teacher_dtype."),
    Rule("distill_beta", ("distill",), lambda a: not 0.0 <= a.distill.beta <= 1.0,
         "--beta must be in [0, 1] (got {distill.beta}): the teacher's weight in GKD's mixture (0: forward KL, 1: "
         "reverse KL)."),
    Rule("distill_beta_unread", ("distill",), lambda a: a.distill.distill_loss != "jsd" and a.distill.beta != 0.5,
         "--beta {distill.beta} is read by --distill_loss jsd only (got --distill_loss {distill.distill_loss}, whose "
         "divergence has no beta): pass --distill_loss jsd, or leave --beta out."),
    Rule("distill_temperature", ("distill",), lambda a: not 0.0 < a.distill.distill_temperature < float("inf"),
         "--distill_temperature must be > 0 (got {distill.distill_temperature}); 1 compares the distributions as "
         "they are, 2 softens both."),
    Rule("distill_sft_weight", ("distill",), lambda a: not 0.0 <= a.distill.sft_weight < float("inf"),
         "--sft_weight must be >= 0 (got {distill.sft_weight}): the weight of the SFT loss added to the divergence "
         "(0: distillation alone)."),
    Rule("distill_lmbda", ("distill",), lambda a: not 0.0 <= a.distill.lmbda <= 1.0,
         "--lmbda must be in [0, 1] (got {distill.lmbda}): the chance that a step trains on the student's own "
         "replies (0: the data's replies only, 1: always the student's)."),
    Rule("distill_on_policy_tokens", ("distill",), lambda a: a.distill.lmbda > 0 and a.distill.on_policy_max_new_tokens < 1,
         "--on_policy_max_new_tokens must be at least 1 (got {distill.on_policy_max_new_tokens}) with --lmbda "
         "{distill.lmbda}: the longest reply the student samples."),
    Rule("distill_prompt_learning", ("distill", "model", "finetuning"), prompt_method,
         "--finetuning_type {kind} cannot be distilled into: the student's logits would include the virtual tokens "
         "the teacher never sees; use --finetuning_type lora or full."),
    Rule("distill_vision", ("distill", "model"), _vision_student_or_teacher,
         "tunesmith distill trains text models only ({path} is a vision-language model, of type {problem}); "
         "give a text model as the student and the teacher."),
    # 4 bits: measured with DeepSpeed 0.19.8 and bitsandbytes 0.50.2, the teacher's first forward in its ZeRO-3
    # engine gives the unsharded teacher's logits and every later one others (its weights regathered wrong).
    Rule("distill_teacher_quantization_zero3", ("distill", "training"),
         lambda a: a.distill.teacher_quantization_bit is not None and zero_stage(a.training) == 3,
         "--teacher_quantization_bit {distill.teacher_quantization_bit} cannot be used with ZeRO-3, which does not "
         "gather a bitsandbytes teacher's weights intact: leave it out (ZeRO-3 shards the teacher over the ranks "
         "instead) or use configs/ds_zero2.json."),
    Rule("distill_teacher_dtype_zero3", ("distill", "training"), lambda a: _teacher_dtype_overridden(a.distill, a.training),
         "--teacher_dtype {distill.teacher_dtype} cannot be kept under ZeRO-3, which holds the teacher in the run's "
         "precision ({held}, from --bf16/--fp16): leave --teacher_dtype out, or use configs/ds_zero2.json."),
    Rule("distill_fsdp", ("distill", "training"), lambda a: fsdp_requested(a.training),
         "tunesmith distill does not run under FSDP (the teacher would stay whole beside a sharded student); use "
         "DeepSpeed ZeRO-2 (--deepspeed configs/ds_zero2.json)."),
    Rule("distill_label_smoothing", ("distill", "training"), lambda a: a.training.label_smoothing_factor != 0,
         "--label_smoothing_factor {training.label_smoothing_factor} would do nothing in tunesmith distill, whose "
         "targets are the teacher's distributions (already soft); leave it out, or raise --distill_temperature."),
    Rule("distill_sequence_parallel", ("distill", "training"), lambda a: sequence_parallel_size(a) > 1,
         "--sequence_parallel_size {training.sequence_parallel_size}: tunesmith distill does not cut rows across "
         "ranks (the teacher would need the same cut); leave it at 1."),
    Rule("distill_vllm_without_on_policy", ("distill", "rollout"),
         lambda a: a.rollout.uses_vllm and not a.distill.lmbda,
         "--rollout_engine vllm samples the student's on-policy replies, and --lmbda is 0 (none are sampled): add "
         "--lmbda (e.g. 0.5), or drop the vLLM flags."),
    Rule("distill_vllm_zero3", ("distill", "rollout", "training"),
         lambda a: a.rollout.uses_vllm and zero_stage(a.training) == 3,
         "--rollout_engine vllm with ZeRO-3: distill hands the vLLM server whole weights, which it does not gather "
         "from ZeRO-3's shards yet; use configs/ds_zero2.json, or --rollout_engine tunesmith (synced sampling)."),
]
