"""Tokenizer and model loading for every stage: the default model, dtype and attention choice,
bitsandbytes quantization (QLoRA), and PEFT adapters, LoRA or prompt-based (new or resumed)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any

import torch
from torch import nn

from ..data.template import apply_chat_template_override
from ..distributed import zero_stage
from ..errors import PathError
from ..families import VisionParts, is_vision_language
from ..hparams import FinetuningArguments, ModelArguments
from ..hparams.parser import resolve_adapter_base
from ..utils.config_facts import fill_pad_token_id
from ..utils.hardware import flash_attention_usable, native_bf16, trains_on_cpu
from ..utils.paths import has_processor, is_torchao_quantized, model_config
from .attention import choose_attn_implementation
from .default_model import ensure_default_model
from .lora_dropout import skip_input_casts_under_autocast, use_fast_lora_dropout
from .lora_targets import check_lora_targets
from .lora_variants import keep_initial_adapter, variant_fields
from .moe import (
    expert_count,
    expert_lora_parameters,
    experts_load_kwargs,
    is_router,
    settle_experts_implementation,
)
from .output_head import contiguous_head_inputs
from .prompt_learning import load_encoder, prompt_learning_config
from .scoring import cast_head_inputs_to_its_dtype
from .trainable_tokens import trainable_token_indices
from .vision import (
    load_processor,
    lora_target_pattern,
    quantization_skipped,
    set_vision_trainable,
    trained_vision_modules,
    vision_parts,
)
from .weights_check import check_adapter_folder, check_load_folders

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(model_args: ModelArguments) -> str:
    if model_args.model_name_or_path is None:
        model_args.model_name_or_path = str(ensure_default_model())
    return model_args.model_name_or_path


def resolve_dtype(model_args: ModelArguments, training_args: Any = None, trains_base: bool = False) -> torch.dtype:
    """The weight dtype. trains_base: the run trains the model's own weights (full fine-tuning)."""
    if model_args.dtype != "auto":
        return DTYPES[model_args.dtype]
    if training_args is not None and getattr(training_args, "bf16", False):
        # On CPU, mixed precision keeps weights that are trained in float32 and autocast runs the
        # products in bf16; weights stored in bf16 would round away most AdamW updates.
        return torch.float32 if trains_base and trains_on_cpu(training_args) else torch.bfloat16
    if training_args is not None and getattr(training_args, "fp16", False):
        return torch.float16
    if native_bf16(on_cpu=False):
        return torch.bfloat16
    return torch.float32


def resolve_attn_implementation(model_args: ModelArguments, task: str = "causal_lm") -> str:
    """--attn_implementation for this model (models/attention.py decides: auto takes what the class supports)."""
    from transformers import AutoConfig

    path = resolve_model_path(model_args)
    with _path_errors(path):
        config = AutoConfig.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    return choose_attn_implementation(model_args.attn_implementation, config, task,
                                      flash_installed=flash_attention_usable())


def load_tokenizer(model_args: ModelArguments, source: str | None = None) -> Any:
    """The model's tokenizer, from `source` when given (an adapter's folder, where training saved it) else the
    model's folder. A vision-language model's is its processor's tokenizer, which reaches the processor
    (models/vision.py)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(model_args)
    check_load_folders(model_args)
    source = source or path
    # transformers says ValueError ("Couldn't instantiate the backend tokenizer ...") for a folder
    # without tokenizer files.
    with _path_errors(source, (OSError, ValueError)):
        if is_vision_language(path):
            tokenizer = load_processor(source if has_processor(source) else path, model_args.chat_template,
                                       model_args.trust_remote_code).tokenizer
        else:
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=model_args.trust_remote_code)
            apply_chat_template_override(tokenizer, model_args.chat_template)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@contextlib.contextmanager
def _path_errors(path: str, errors: tuple[type[Exception], ...] = (OSError,)):
    """transformers' error for a folder without model or tokenizer files (or a hub id that cannot be
    fetched) as one message naming the flag."""
    try:
        yield
    except errors as e:
        if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
            reason = (f"no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}) in it: copy them from the model "
                      "it was made from")
        else:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PathError(f"--model_name_or_path {path}: cannot load a model or tokenizer from it ({reason})") from e


def quantization_config(model_args: ModelArguments, dtype: torch.dtype, skip: list[str] | None = None) -> Any:
    """bitsandbytes' settings for --quantization_bit; `skip`: modules left unquantized (a vision model's tower)."""
    if model_args.quantization_bit is None:
        return None
    from transformers import BitsAndBytesConfig

    if model_args.quantization_bit == 8:
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        llm_int8_skip_modules=skip,
        bnb_4bit_quant_type=model_args.quantization_type,
        bnb_4bit_use_double_quant=model_args.double_quantization,
        bnb_4bit_compute_dtype=dtype,
        # Stored in the compute dtype, ZeRO-3 can shard the packed 4-bit weights like any other tensor.
        bnb_4bit_quant_storage=dtype,
    )


def linear_module_types() -> tuple[type, ...]:
    types: list[type] = [nn.Linear]
    try:
        import bitsandbytes as bnb

        types += [bnb.nn.Linear4bit, bnb.nn.Linear8bitLt]
    except ImportError:
        pass
    return tuple(types)


def find_lora_targets(model: nn.Module) -> list[str]:
    """Names of every linear layer (plain or bitsandbytes) except output heads and a MoE model's routers. A router
    stays frozen: it is a [experts, hidden] matrix, which a rank-16 LoRA does not make smaller, and moving it
    re-routes tokens away from the experts their pretrained routing (and the adapters on them) were made for;
    unsloth leaves it out by default too. Full fine-tuning trains it, with the load-balancing loss
    (train/router_loss.py)."""
    heads = {"lm_head", "score", "v_head", "classifier"}
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    experts = expert_count(model.config) if hasattr(model, "config") else None
    names = set()
    for full_name, module in model.named_modules():
        if not isinstance(module, linear_module_types()) or module is output or is_router(full_name, module, experts):
            continue
        leaf = full_name.rsplit(".", 1)[-1]
        if leaf not in heads:
            names.add(leaf)
    return sorted(names)


def dropout_off(path: str, trust_remote_code: bool = False) -> dict[str, Any]:
    """The config's dropout probabilities set to 0, as from_pretrained overrides (`attention_dropout`,
    `hidden_dropout_prob`, GPT-2's `attn_pdrop`, ...): the modules read them when they are built. A composite
    config's sub-configs (a vision-language model's text_config and vision_config) get theirs as a dict under the
    sub-config's name, which from_pretrained applies to those fields only."""
    from transformers import AutoConfig

    with _path_errors(path):
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code).to_dict()
    overrides: dict[str, Any] = _dropouts_at_zero(config)
    for key, value in config.items():
        if isinstance(value, dict) and (inner := _dropouts_at_zero(value)):
            overrides[key] = inner
    return overrides


def _dropouts_at_zero(config: dict[str, Any]) -> dict[str, float]:
    return {key: 0.0 for key, value in config.items()
            if isinstance(value, float) and value > 0 and ("dropout" in key or key.endswith("_pdrop"))}


def load_model(
    model_args: ModelArguments,
    finetuning_args: FinetuningArguments,
    training_args: Any = None,
    is_trainable: bool = True,
    task: str = "causal_lm",
) -> nn.Module:
    """The model for a stage. task: causal_lm, or reward (a one-output sequence-classification head).
    LoRA and prompt-based runs return a PeftModel (a new adapter, or the one in adapter_name_or_path)."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSequenceClassification,
    )

    path = resolve_model_path(model_args)
    check_load_folders(model_args)
    with _path_errors(path):
        config = AutoConfig.from_pretrained(path, trust_remote_code=model_args.trust_remote_code)
    vision = vision_parts(config) if is_vision_language(path) else None
    dtype = resolve_dtype(model_args, training_args, trains_base=is_trainable and finetuning_args.finetuning_type == "full")
    if is_torchao_quantized(path):  # a --qat run's quantized/: torchao's tensors compute in the dtype they were made in
        dtype = DTYPES.get(model_config(path).get("dtype"), torch.float32)
    kwargs: dict[str, Any] = {
        "dtype": dtype,
        "attn_implementation": resolve_attn_implementation(model_args, task),
        "trust_remote_code": model_args.trust_remote_code,
        **experts_load_kwargs(model_args.experts_implementation, config),
    }
    if finetuning_args.disable_dropout:
        kwargs |= dropout_off(path, model_args.trust_remote_code)
    quant = quantization_config(model_args, dtype, quantization_skipped(vision) if vision else None)
    if quant is not None:
        kwargs["quantization_config"] = quant
        # bitsandbytes places weights as they load, each rank on its own device; under ZeRO-3,
        # deepspeed.zero.Init places them instead and refuses a device_map.
        if training_args is None or zero_stage(training_args) != 3:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            kwargs["device_map"] = {"": local if torch.cuda.is_available() else "cpu"}
    if task == "reward":
        with _quiet_about_the_new_score_head(), _path_errors(path):
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **kwargs)
        logger.info("score head: %s", f"from the adapter {model_args.adapter_name_or_path}"
                    if model_args.adapter_name_or_path else "new, trained in this run" if is_trainable
                    else "new and untrained (no reward adapter given)")
    else:
        with _path_errors(path):
            model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_pretrained(path, **kwargs)
        contiguous_head_inputs(model)
    if vision and is_trainable and not finetuning_args.adapter:
        set_vision_trainable(model, vision, finetuning_args.train_vision_tower, finetuning_args.train_projector)
    fill_pad_token_id(model)
    settle_experts_implementation(model, model_args.experts_implementation)
    if finetuning_args.adapter:
        model = attach_adapter(model, model_args, finetuning_args, training_args, is_trainable, task, vision)
    elif not is_trainable:
        model.requires_grad_(False)
    if not is_trainable:
        model.eval()
    log_parameter_counts(model)
    return model


def attach_adapter(model: nn.Module, model_args: ModelArguments, finetuning_args: FinetuningArguments,
                   training_args: Any, is_trainable: bool = True, task: str = "causal_lm",
                   vision: VisionParts | None = None) -> nn.Module:
    """The loaded model with its PEFT adapter (`_attach_adapter`), made ready to train when is_trainable: what
    load_model does after from_pretrained, and what `tunesmith plan` runs on a model built without weights."""
    model = _attach_adapter(model, model_args, finetuning_args, training_args, is_trainable, task, vision)
    if is_trainable:
        _upcast_trainable(model, training_args)
        if task == "reward":
            cast_head_inputs_to_its_dtype(model)
        if not finetuning_args.prompt_learning:
            skip_input_casts_under_autocast(model)
            if trains_on_cpu(training_args):  # torch's CUDA dropout is already fast
                use_fast_lora_dropout(model)
    return model


class _NewScoreHeadReport(logging.Filter):
    """Drops transformers' load report when the only weights it lists as missing are the score
    head's: a causal LM has none, so a reward model always reports it, even when the head is about
    to come from the reward adapter. Any other missing or unexpected weight keeps the report."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "LOAD REPORT" not in message:
            return True
        rows = [line.split("|") for line in message.splitlines() if line.count("|") >= 2]
        listed = [(cells[0].strip(), cells[1].strip()) for cells in rows if cells[0].strip() not in ("Key", "")]
        listed = [(key, status) for key, status in listed if not set(key) <= {"-", "+"}]
        return not listed or not all(key.startswith("score.") and "MISSING" in status for key, status in listed)


@contextlib.contextmanager
def _quiet_about_the_new_score_head():
    report_logger = logging.getLogger("transformers.modeling_utils")
    quiet = _NewScoreHeadReport()
    report_logger.addFilter(quiet)
    try:
        yield
    finally:
        report_logger.removeFilter(quiet)


def _attach_adapter(model: nn.Module, model_args: ModelArguments, finetuning_args: FinetuningArguments,
                    training_args: Any, is_trainable: bool, task: str, vision: VisionParts | None = None) -> nn.Module:
    """A new adapter of --finetuning_type (LoRA, or a prompt-based method), or the one in adapter_name_or_path
    whatever its kind (PEFT's adapter_config.json says which). On a vision-language model a new LoRA adapts the
    language model's layers only, and trains the vision parts asked for whole beside it."""
    from peft import LoraConfig, PeftModel, TaskType, get_peft_model, prepare_model_for_kbit_training

    checkpointing = bool(training_args is not None and training_args.gradient_checkpointing)
    if model_args.quantization_bit is not None and is_trainable:
        loaded_bf16 = [p for p in model.parameters() if p.dtype == torch.bfloat16]
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
        if model_args.quantization_bit == 4 and getattr(training_args, "bf16", False):
            _undo_kbit_upcast(loaded_bf16)
    elif checkpointing:
        # Frozen embeddings give checkpointed blocks inputs without grad; LoRA grads would vanish.
        model.enable_input_require_grads()
    if model_args.adapter_name_or_path:
        model = PeftModel.from_pretrained(model, model_args.adapter_name_or_path, is_trainable=is_trainable)
        if is_trainable:
            load_encoder(model, model_args.adapter_name_or_path)  # p-tuning's MLP, saved beside its adapter
        return model
    if finetuning_args.prompt_learning:
        return get_peft_model(model, prompt_learning_config(finetuning_args, model_args.model_name_or_path))
    targets, parameters = finetuning_args.lora_target, []
    language = model.get_submodule(vision.language) if vision else model
    if targets == ["all"]:
        targets = find_lora_targets(language)
        parameters = expert_lora_parameters(model, finetuning_args.lora_dropout)  # MoE experts stored fused
    else:
        check_lora_targets(language, targets, find_lora_targets(language))
    config = LoraConfig(
        r=finetuning_args.lora_r,
        lora_alpha=finetuning_args.lora_alpha,
        lora_dropout=finetuning_args.lora_dropout,
        target_modules=lora_target_pattern(vision, targets) if vision else targets,
        modules_to_save=[*(trained_vision_modules(vision, finetuning_args.train_vision_tower,
                                                  finetuning_args.train_projector) if vision else []),
                         *finetuning_args.lora_modules_to_save] or None,
        # a model whose head is its embedding matrix (SmolLM2, Gemma, Qwen's small ones) keeps one matrix: PEFT
        # otherwise trains a copy of the embeddings and leaves the head as it was, untied
        ensure_weight_tying=bool(finetuning_args.lora_modules_to_save),
        trainable_token_indices=trainable_token_indices(finetuning_args.lora_trainable_tokens, model,
                                                        training_args, lambda: load_tokenizer(model_args)),
        target_parameters=parameters or None,
        task_type=TaskType.SEQ_CLS if task == "reward" else TaskType.CAUSAL_LM,
        # DoRA, rsLoRA, the initialisation (models/lora_variants.py); `tunesmith plan` builds the model without
        # weights, which PiSSA/OLoRA cannot decompose: its adapter has the same shapes with LoRA's own init
        **variant_fields(finetuning_args, has_weights=not next(model.parameters()).is_meta),
    )
    model = get_peft_model(model, config)
    if is_trainable:
        keep_initial_adapter(model)  # PiSSA/OLoRA: for the final save's conversion to a plain LoRA
    return model


def _undo_kbit_upcast(loaded_bf16: list[nn.Parameter]) -> None:
    """PEFT's prepare_model_for_kbit_training casts every weight outside the 4-bit layers (embeddings, norms, a
    tied head) to float32, for fp16 training's sake. They are frozen; under bf16 autocast the float32 copies only
    turn the residual stream and every 4-bit layer's output into float32 activations: 35% more memory saved for
    backward per token on a Llama shape (docs/benchmark.md), and a cast in and out of every 4-bit product. So
    with --bf16 they go back to the bf16 they loaded in, as LLaMA-Factory (no upcast by default) and TRL's
    SFTTrainer (which does not call it) leave them. The trained LoRA weights stay float32."""
    upcast = [p for p in loaded_bf16 if p.dtype == torch.float32 and not p.requires_grad]
    for param in upcast:
        param.data = param.data.to(torch.bfloat16)
    if upcast:
        logger.info("QLoRA under bf16: %d frozen tensors outside the 4-bit layers stay bfloat16 (not upcast to "
                    "float32)", len(upcast))


def _upcast_trainable(model: nn.Module, training_args: Any) -> None:
    """Trained weights of a half-precision base (the score head of a reward model; PEFT already keeps
    LoRA's and the prompt encoders' own in float32) go to float32, so AdamW's small updates are not rounded away. DeepSpeed
    keeps float32 master copies of its own."""
    if training_args is not None and getattr(training_args, "deepspeed", None):
        return
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()


def _full_numel(p: nn.Parameter) -> int:
    # Under ZeRO-3 a parameter in memory is an empty placeholder; DeepSpeed keeps its real size.
    return getattr(p, "ds_numel", p.numel())


def log_parameter_counts(model: nn.Module) -> tuple[int, int]:
    trainable = sum(_full_numel(p) for p in model.parameters() if p.requires_grad)
    total = sum(_full_numel(p) for p in model.parameters())
    logger.info("parameters: %s trainable of %s (%.3f%%)", f"{trainable:,}", f"{total:,}", 100 * trainable / max(total, 1))
    return trainable, total


def inference_model_args(model_name_or_path: str | None, adapter: str | None = None, **overrides: Any) -> ModelArguments:
    """ModelArguments for loading a trained result: a merged/full model directory, or an adapter
    directory given as the model (its base is read from adapter_config.json), or base + adapter."""
    model_args = ModelArguments(model_name_or_path=model_name_or_path, adapter_name_or_path=adapter, **overrides)
    resolve_adapter_base(model_args)
    return model_args


def load_trained_tokenizer(model_args: ModelArguments) -> Any:
    """The adapter's tokenizer when training saved one beside it (it carries the chat template the
    adapter was trained with), else the model's."""
    adapter = model_args.adapter_name_or_path
    if adapter and os.path.isfile(os.path.join(adapter, "tokenizer_config.json")):
        return load_tokenizer(model_args, source=adapter)
    return load_tokenizer(model_args)


def inference_device() -> torch.device:
    """Where a model for inference (chat, serve, score, compare, merge) runs: the GPU when there is
    one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def serving_model_args(model_args: ModelArguments) -> ModelArguments:
    """The model arguments a server loads with: `--dtype auto` serves in bfloat16 where the hardware computes
    it natively (a GPU with bf16, a CPU with AVX512-BF16/AMX), as SFT trains there: a decode step reads
    every weight, and half the bytes with AMX's bf16 products measured twice the tokens/s of float32 on the
    2-core CPU (docs/benchmark.md). Elsewhere, and for a quantized base, the choice stays resolve_dtype's."""
    if model_args.dtype != "auto" or model_args.quantization_bit is not None:
        return model_args
    if not native_bf16(on_cpu=inference_device().type == "cpu"):
        return model_args
    return dataclasses.replace(model_args, dtype="bfloat16")


def load_for_inference(model_args: ModelArguments, task: str = "causal_lm") -> tuple[nn.Module, Any]:
    """(model in eval mode with no trainable weights, on `inference_device()`, tokenizer) for a
    trained result. The tokenizer (and its chat template) comes from the adapter folder when it has
    one, since that is what training saved."""
    finetuning = FinetuningArguments(finetuning_type="lora" if model_args.adapter_name_or_path else "full")
    tokenizer = load_trained_tokenizer(model_args)
    model = load_model(model_args, finetuning, is_trainable=False, task=task)
    if model_args.quantization_bit is None:  # quantized weights were placed as they loaded (device_map)
        model.to(inference_device())
    return model, tokenizer


def add_adapters(model: nn.Module, model_args: ModelArguments, adapters: dict[str, str]) -> tuple[nn.Module, dict[str, Any]]:
    """The model with each adapter of `adapters` ({name: folder}) loaded beside any it has, for inference,
    and each adapter's tokenizer (the chat template it was trained with)."""
    from peft import PeftModel

    tokenizers = {}
    for name, path in adapters.items():
        check_adapter_folder(path)
        if isinstance(model, PeftModel):
            model.load_adapter(path, adapter_name=name, is_trainable=False)
        else:
            model = PeftModel.from_pretrained(model, path, adapter_name=name, is_trainable=False)
        tokenizers[name] = load_trained_tokenizer(dataclasses.replace(model_args, adapter_name_or_path=path))
    model.eval()
    return model, tokenizers
