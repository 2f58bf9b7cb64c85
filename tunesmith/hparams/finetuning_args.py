"""What is trained: LoRA, PEFT's prompt-based methods or every weight (the reward model's and DPO's loss settings
are the preference feature's, tunesmith/preference/args.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from .data_args import comma_list


@dataclass
class FinetuningArguments:
    role: ClassVar[str] = "finetuning"
    _argument_group_name: ClassVar[str] = "fine-tuning"
    result_neutral: ClassVar[frozenset[str]] = frozenset({"plot_loss"})  # hparams/run_config.py

    finetuning_type: Literal["lora", "full", "prompt_tuning", "p_tuning", "prefix_tuning"] = field(
        default="lora",
        metadata={"help": "lora: train adapters on a frozen base. full: train every weight. prompt_tuning: train "
                  "--num_virtual_tokens embeddings put before every input. p_tuning: the same embeddings made by a "
                  "small trained MLP. prefix_tuning: train keys and values for --num_virtual_tokens positions "
                  "before the input, in every layer. The prompt-based three save a PEFT adapter like LoRA's, which "
                  "chat, serve and compare load; there is nothing in them to merge into the weights."},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input."})
    # None is auto, resolved by train/run_setup.prepare_training_run for the stage.
    disable_dropout: bool | None = field(
        default=None,
        metadata={"help": "Load the model with every dropout probability of its config at 0 (attention, hidden, "
                  "embedding...), as DeepSpeed-Chat's --disable_dropout; --lora_dropout is separate. Default: on for "
                  "PPO/GRPO/RLOO (a policy ratio of two forwards must not differ by dropout noise), off elsewhere."},
    )
    lora_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Learning rate of the LoRA matrices when other weights train beside them (a reward model's "
                  "score head, PPO's value head); those keep --learning_rate. Default: --learning_rate for all."},
    )
    use_dora: bool = field(
        default=False,
        metadata={"help": "DoRA (Liu et al. 2024, arXiv 2402.09353): each adapted weight split into a trained "
                  "magnitude per output row and a direction that LoRA changes; closer to full fine-tuning at low "
                  "rank. Costs a weight norm per adapted layer in every forward (slower steps, more memory) and a "
                  "vector per layer; the adapter merges like LoRA's, but llama.cpp's adapter GGUF cannot carry the "
                  "magnitudes (export it merged)."},
    )
    use_rslora: bool = field(
        default=False,
        metadata={"help": "rsLoRA (Kalajdzievski 2023, arXiv 2312.03732): scale the adapter by lora_alpha / sqrt(r) "
                  "instead of lora_alpha / r, so higher ranks keep learning; free. With the defaults (r 16, alpha "
                  "32) the update is 4x larger: lower the learning rate or alpha to match."},
    )
    init_lora_weights: str = field(
        default="true",
        metadata={"help": "How a new adapter starts (PEFT's init_lora_weights). true: B at zero, A random (LoRA's "
                  "own). gaussian: A drawn from a Gaussian scaled by the rank. pissa: A and B from the weight's top "
                  "r singular vectors, the rest left as the (residual) base weight, an SVD per layer at load; "
                  "pissa_niter_N: the same by a fast randomized SVD with N subspace iterations (pissa_niter_4 is "
                  "quick on large models). olora: A and B from a QR decomposition of the weight, the base left as "
                  "the residual. orthogonal: A and B orthogonal, the base untouched (even --lora_r only). pissa and "
                  "olora want --lora_dropout 0 (a dropout on their input drops part of the weights) and change the "
                  "base in memory: the final adapter is saved converted to a plain LoRA of the "
                  "unchanged base (rank 2r; its checkpoints keep rank r and resume). Not with --quantization_bit "
                  "(the residual must be made from unquantized weights), and not loftq: see docs/sft.md."},
    )
    loraplus_lr_ratio: float | None = field(
        default=None,
        metadata={"help": "LoRA+ (Hayou et al. 2024, arXiv 2402.12354): train LoRA's B matrices (and DoRA's "
                  "magnitudes) at this many times the LoRA learning rate (--lora_learning_rate, else "
                  "--learning_rate), the A matrices at that rate; the paper suggests 16, with the base rate "
                  "about halved. Default: one rate for A and B."},
    )
    lora_target: list[str] = field(
        default_factory=lambda: ["all"],
        metadata={"help": "Module names to adapt; `all` means every linear layer except the output head and a "
                  "mixture-of-experts model's routers, plus the experts' fused 3-D weights (gate_up_proj, down_proj) "
                  "when --lora_dropout is 0: PEFT's LoRA on a parameter takes no dropout, so with one they stay "
                  "untrained and the log names them."},
    )
    lora_modules_to_save: list[str] = field(
        default_factory=list,
        metadata={"help": "Modules a LoRA run trains whole beside the adapter and saves with it (PEFT's "
                  "modules_to_save), e.g. embed_tokens,lm_head when continued pre-training teaches a new language "
                  "whose tokens the frozen embeddings represent poorly. Costs their full size in gradients and "
                  "optimizer state, and in the adapter file."},
    )
    lora_trainable_tokens: list[str] = field(
        default_factory=list,
        metadata={"help": "Tokens whose rows of the input embeddings and of the output head (one matrix where the "
                  "model ties them) a LoRA run trains beside the adapter and saves with it, the other rows frozen "
                  "(PEFT's trainable tokens), e.g. the tokens of a new language's script, or reserved tokens put to "
                  "a new use: each a token id, a text that encodes as one token (é, <|im_start|>), or an entry of "
                  "the vocabulary as the tokenizer spells it (Ġriver); comma-separated (give a comma by its id). "
                  "Costs only those rows, where --lora_modules_to_save embed_tokens,lm_head trains and saves the "
                  "whole matrices."},
    )
    router_aux_loss_coef: float | None = field(
        default=None,
        metadata={"help": "SFT of a mixture-of-experts model (Qwen3-MoE, Mixtral, gpt-oss, OLMoE, ...): the weight of "
                  "the routers' load-balancing loss in the objective, added once per optimizer step whatever the "
                  "accumulation or packing. Default: the model's own router_aux_loss_coef; 0 leaves it out. Logged "
                  "as aux_loss (unweighted; about top-k when the experts are evenly loaded) beside loss, which stays "
                  "the language-model loss."},
    )
    train_vision_tower: bool = field(
        default=False,
        metadata={"help": "A vision-language model: train its vision tower too (whole, beside the LoRA adapter, or "
                  "with full fine-tuning). Default: frozen, as LLaMA-Factory and TRL leave it."},
    )
    train_projector: bool = field(
        default=False,
        metadata={"help": "A vision-language model: train the projector that maps image features into the language "
                  "model (Qwen's merger, Gemma's and LLaVA's multi_modal_projector, Idefics' connector), whole. "
                  "Default: frozen."},
    )
    num_virtual_tokens: int = field(
        default=20,  # the rules table reads this default: another value needs a prompt-based method
        metadata={"help": "prompt_tuning, p_tuning, prefix_tuning: how many virtual tokens to train."},
    )
    prompt_tuning_init_text: str | None = field(
        default=None,
        metadata={"help": "prompt_tuning: start the virtual tokens from this text's token embeddings (repeated to "
                  "--num_virtual_tokens), e.g. \"Answer as the tunesmith assistant.\"; default: random vocabulary "
                  "embeddings."},
    )
    plot_loss: bool = field(default=True, metadata={"help": "Write loss.png in output_dir at the end."})

    def __post_init__(self) -> None:
        self.lora_modules_to_save = comma_list(self.lora_modules_to_save)  # embed_tokens,lm_head as two names
        self.lora_trainable_tokens = comma_list(self.lora_trainable_tokens)

    @property
    def prompt_learning(self) -> bool:
        """A PEFT prompt-based method: virtual tokens before the input, no weight of the model changed."""
        return self.finetuning_type in PROMPT_LEARNING

    @property
    def adapter(self) -> bool:
        """The run trains (or continues) a PEFT adapter: LoRA or a prompt-based method."""
        return self.finetuning_type != "full"


PROMPT_LEARNING = ("prompt_tuning", "p_tuning", "prefix_tuning")

# --init_lora_weights values passed to PEFT, besides pissa_niter_N. PEFT's others need what one flag cannot give:
# loftq a LoftQConfig and a base it rewrites, eva/corda/lora_ga a pass over the data; false is for debugging.
LORA_INITIALISATIONS = ("true", "gaussian", "pissa", "olora", "orthogonal")


def is_known_init(value: str) -> bool:
    return value in LORA_INITIALISATIONS or re.fullmatch(r"pissa_niter_\d+", value) is not None


def splits_base(value: str) -> bool:
    """PiSSA and OLoRA: the initialisation moves part of each adapted weight into the adapter, leaving a residual."""
    return value.startswith("pissa") or value == "olora"



@dataclass
class QATArguments:
    """Quantization-aware training (tunesmith/models/qat.py), for the stages that train a model to be served
    quantized: sft and pt."""

    role: ClassVar[str] = "qat"
    _argument_group_name: ClassVar[str] = "quantization-aware training"

    qat: Literal["int8_int4", "int4"] | None = field(
        default=None,
        metadata={"help": "Train with torchao's fake quantization of the decoder's linear layers (not the head or the "
                  "embeddings), then write the real quantized model to output_dir/quantized/ (torchao's convert; "
                  "from_pretrained loads it, serve and chat run it). int8_int4: int8 activations quantized per token "
                  "as they come + int4 weights in groups (torchao's Int8DynActInt4Weight scheme). int4: int4 weights "
                  "in groups, float activations. Full fine-tuning fake-quantizes the weights; LoRA the merged weight "
                  "W + BA (what is served), so quantized/ is the adapter merged and converted. Needs torchao "
                  "(pip install 'tunesmith[qat]'); docs/sft.md."},
    )
    qat_group_size: int = field(
        default=32,
        metadata={"help": "--qat: how many input weights share one int4 scale; must divide every quantized layer's "
                  "inputs."},
    )
