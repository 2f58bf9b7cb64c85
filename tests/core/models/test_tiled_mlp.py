"""The sequence-tiled MLP (models/tiled_mlp.py, `--tiled_mlp`): on every model type it tiles, the loss and the
gradients (full fine-tuning, LoRA, QLoRA) of a packed row of several conversations are the untiled model's, with
activation checkpointing on and off; LoRA's dropout sees the same masks in the backward as in the forward; the MLP's
intermediate activations, counted, are one chunk's; a mixture of experts is refused in one line.

Memory is counted, not timed: with saved-tensor hooks (what a forward keeps for its backward, as tests/core/train/test_memory.py
counts it), and with a dispatch mode that follows every [..., intermediate_size] tensor an operator makes from its
creation until its storage is freed, over a whole forward and backward (torch's non-reentrant checkpoint recomputes
under hooks of its own, which the saved-tensor hooks cannot see)."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import AutoModelForCausalLM

from tests.cli.test_cli_errors import assert_one_line_error, cli, write_jsonl
from tests.core.train.test_head_loss import packed_batch
from tests.core.train.test_memory import StorageCounter
from tests.helpers.arch_models import architecture_config, build_architecture
from tunesmith.errors import ConfigError
from tunesmith.hparams import parse_run
from tunesmith.models import tiled_mlp
from tunesmith.models.lora_dropout import use_fast_lora_dropout
from tunesmith.models.tiled_mlp import TILED_MLP_TYPES, install_tiled_mlp, mlp_chunks

LENGTHS = (50, 90, 30, 63)  # 233 tokens: ceil(233 / 64) = 4 chunks of 59, 59, 59 and 56
EVEN = (64, 96, 40, 40)  # 240 tokens: 4 chunks of 60
INTERMEDIATE = 160  # an MLP width no other activation of these models has


def tiny(name: str, tokenizer, checkpointing: bool = False, **overrides) -> torch.nn.Module:
    try:
        config = architecture_config(name, tokenizer, **overrides)
    except KeyError:
        pytest.skip(f"this transformers has no {name}")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def with_lora(model: torch.nn.Module, dropout: float = 0.0) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    from tunesmith.models.loader import find_lora_targets

    torch.manual_seed(1)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=find_lora_targets(model),
                      init_lora_weights=False)  # B random too, so every LoRA matrix has a gradient that shows
    model = get_peft_model(model, lora)
    if getattr(model.get_base_model(), "is_gradient_checkpointing", False):
        model.enable_input_require_grads()  # the embeddings are frozen: a checkpointed layer's input needs grad
    return model


def loss_and_grads(model: torch.nn.Module, batch: dict, seed: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    torch.manual_seed(seed)
    loss = model(**batch).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(tiled: tuple, untiled: tuple, what: str) -> None:
    assert tiled[0] == pytest.approx(untiled[0], abs=1e-6), what
    assert tiled[1].keys() == untiled[1].keys() and tiled[1], what
    for key, grad in tiled[1].items():
        assert torch.allclose(grad, untiled[1][key], rtol=1e-5, atol=1e-6), f"{what}: {key}"


def mlp_is_tiled(model: torch.nn.Module) -> bool:
    layers = tiled_mlp.causal_lm(model).get_decoder().layers
    return all(getattr(layer.mlp.forward, "tiled_mlp", False) for layer in layers)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["stored", "checkpointed"])
@pytest.mark.parametrize("finetuning", ["full", "lora"])
@pytest.mark.parametrize("name", sorted(TILED_MLP_TYPES))
def test_tiled_mlp_gives_the_untiled_loss_and_gradients(name, finetuning, checkpointing, tokenizer):
    model = tiny(name, tokenizer, checkpointing)
    if finetuning == "lora":
        model = with_lora(model)
    batch = packed_batch(tokenizer, LENGTHS)
    assert batch["input_ids"].shape == (1, sum(LENGTHS)) and mlp_chunks(sum(LENGTHS), 64) == 4
    untiled = loss_and_grads(model, batch)
    assert install_tiled_mlp(model) == 2 and mlp_is_tiled(model)
    assert_same(loss_and_grads(model, batch), untiled, f"{name} {finetuning}")


@pytest.mark.parametrize("fast_dropout", [False, True], ids=["torch_dropout", "cpu_fast_dropout"])
def test_lora_dropout_masks_of_the_backward_are_the_forwards(fast_dropout, tokenizer, monkeypatch):
    """Each chunk's recomputation draws LoRA's dropout masks from the random state its forward drew them from: the
    gradients are those of the chunks run without recomputation (every activation kept), which draw the same masks
    in the same order. (DeepSpeed's TiledMLP recomputes with the random state moved on, and would fail this.)"""
    model = with_lora(tiny("llama", tokenizer), dropout=0.3)
    if fast_dropout:
        assert use_fast_lora_dropout(model) > 0
    install_tiled_mlp(model)
    batch = packed_batch(tokenizer, LENGTHS)
    recomputed = loss_and_grads(model, batch, seed=5)
    monkeypatch.setattr(tiled_mlp, "checkpoint", lambda function, *args, **kwargs: function(*args))
    kept = loss_and_grads(model, batch, seed=5)
    assert_same(recomputed, kept, "dropout")
    assert loss_and_grads(model, batch, seed=6)[0] != pytest.approx(kept[0], abs=1e-6)  # the masks do matter


def test_qlora_gradients_are_the_untiled_ones(tokenizer, tmp_path):
    """A 4-bit NF4 base (bitsandbytes on CPU), LoRA on every linear layer, checkpointed as QLoRA trains."""
    pytest.importorskip("bitsandbytes")
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    path = build_architecture(tmp_path / "llama", "llama", tokenizer)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=quant, dtype=torch.float32,
                                                 device_map={"": "cpu"}, attn_implementation="eager")
    model = with_lora(prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)).train()
    assert "Linear4bit" in type(model.get_base_model().model.layers[0].mlp.gate_proj.base_layer).__name__
    batch = packed_batch(tokenizer, LENGTHS)
    untiled = loss_and_grads(model, batch)
    install_tiled_mlp(model)
    assert_same(loss_and_grads(model, batch), untiled, "qlora")


def test_the_forward_keeps_no_intermediate_activation_of_a_tiled_mlp(tokenizer):
    """Without checkpointing an untiled MLP keeps its [tokens, intermediate] activations for the backward (gate, up,
    their activation, their product: several per layer); tiled it keeps only its input, which the untiled one keeps
    too."""

    def intermediates_saved(model) -> int:
        counter = StorageCounter({p.untyped_storage().data_ptr(): n for n, p in model.named_parameters()})
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
            loss = model(**batch).loss
        loss.backward()
        return sum(1 for s in counter.result().storages
                   if s.parameter is None and any(shape[-1:] == (INTERMEDIATE,) for shape in s.shapes))

    batch = packed_batch(tokenizer, EVEN)
    model = tiny("llama", tokenizer, intermediate_size=INTERMEDIATE)
    untiled = intermediates_saved(model)
    install_tiled_mlp(model)
    assert untiled >= 2 * 3 and intermediates_saved(model) == 0  # 2 layers


class LiveIntermediates(TorchDispatchMode):
    """The most bytes of [..., width] tensors alive at once among those operators make: each storage counted from
    the operator that makes it until it is freed. Tensors of a parameter's shape (the weight [hidden, intermediate]
    of down_proj, its views and its gradient) are not activations and are left out."""

    def __init__(self, width: int, parameter_shapes: set[tuple[int, ...]]) -> None:
        super().__init__()
        self.width, self.live, self.peak, self.alive = width, 0, 0, set()
        self.parameter_shapes = parameter_shapes

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.alive.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if (not isinstance(tensor, torch.Tensor) or tensor.shape[-1:] != (self.width,)
                    or tuple(tensor.shape) in self.parameter_shapes):
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key not in self.alive and storage.nbytes():
                self.alive.add(key)
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._freed, key, storage.nbytes())
        return out


@pytest.mark.parametrize("checkpointing", [False, True], ids=["stored", "checkpointed"])
def test_the_mlps_working_set_shrinks_by_the_number_of_chunks(checkpointing, tokenizer):
    """Over a whole forward and backward (recomputations included) the MLP's intermediate activations alive at once
    are at most one chunk's: a quarter of the untiled layer's at 4 chunks, or less (stored, the untiled model holds
    every layer's at once)."""
    batch = packed_batch(tokenizer, EVEN)

    def peak(model) -> int:
        live = LiveIntermediates(INTERMEDIATE, {tuple(p.shape) for p in model.parameters()})
        with live:
            model(**batch).loss.backward()
        return live.peak

    model = tiny("llama", tokenizer, checkpointing, intermediate_size=INTERMEDIATE)
    untiled = peak(model)
    install_tiled_mlp(model)
    tiled = peak(model)
    assert mlp_chunks(sum(EVEN), 64) == 4
    assert 0 < tiled and tiled * 4 <= untiled


class LiveFloat32Rows(LiveIntermediates):
    """LiveIntermediates of float32 tensors only: in a bf16 model, the [..., hidden] ones are the norms' upcasts."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kept = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.dtype == torch.float32]
        if kept:
            super().__torch_dispatch__(lambda *a, **k: kept, types)
        return out


@pytest.mark.parametrize("name", ["llama", "gemma3_text", "qwen3"])
def test_the_norms_float32_working_set_is_one_chunks(name, tokenizer):
    """A bf16 model's norms compute in float32: untiled, one norm's backward in a checkpointed layer holds several
    float32 copies of the whole row at once (the largest part of a long step's peak, issue 52); tiled, a chunk's.
    The norms are among the tiled modules (Qwen3's per-head q/k norms too), and their loss and gradients are the
    untiled ones (the parametrized test above, in float32)."""
    batch = packed_batch(tokenizer, EVEN)
    model = tiny(name, tokenizer, checkpointing=True).to(torch.bfloat16)
    hidden = model.config.hidden_size

    def peak() -> int:
        live = LiveFloat32Rows(hidden, {tuple(p.shape) for p in model.parameters()})
        with live:
            model(**batch).loss.backward()
        model.zero_grad()
        return live.peak

    untiled = peak()
    install_tiled_mlp(model)
    decoder = tiled_mlp.causal_lm(model).get_decoder()
    norms = [m for layer in decoder.layers for m in tiled_mlp.layer_norms(layer)] + [decoder.norm]
    assert norms and all(getattr(norm.forward, "tiled_mlp", False) for norm in norms)
    tiled = peak()
    assert untiled >= 2 * sum(EVEN) * hidden * 4  # at least two float32 copies of the row at once
    assert 0 < tiled and tiled * 3 <= untiled, (tiled, untiled)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_a_mixture_of_experts_is_refused_in_one_line(name, tokenizer):
    model = tiny(name, tokenizer)
    with pytest.raises(ConfigError, match=rf"^--tiled_mlp: model type {name} routes tokens to experts, .* the whole "
                                          r"sequence's routing: .*Drop --tiled_mlp\.$"):
        install_tiled_mlp(model)
    assert not any(getattr(layer.mlp.forward, "tiled_mlp", False) for layer in model.model.layers)


def test_prompt_tuning_gradients_are_the_untiled_ones(tokenizer):
    """The virtual tokens PEFT puts before the row go through the MLP as tokens of their own: tiled, the same."""
    from peft import PromptTuningConfig, get_peft_model

    model = get_peft_model(tiny("llama", tokenizer), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=20))
    batch = {"input_ids": packed_batch(tokenizer, LENGTHS)["input_ids"]}
    batch["labels"] = batch["input_ids"]
    untiled = loss_and_grads(model, batch)
    assert mlp_chunks(sum(LENGTHS) + 20, 64) == 4
    install_tiled_mlp(model)
    assert_same(loss_and_grads(model, batch), untiled, "prompt tuning")


def test_the_command_refuses_a_mixture_of_experts_in_one_line(tokenizer, tmp_path):
    model = build_architecture(tmp_path / "mixtral", "mixtral", tokenizer)
    proc = cli("sft/train.py", "--model_name_or_path", model, "--data_path", write_jsonl(tmp_path / "d.jsonl"),
               "--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--tiled_mlp", "true", cwd=tmp_path)
    assert_one_line_error(proc, "--tiled_mlp: model type mixtral routes tokens to experts", "Drop --tiled_mlp.")


def test_the_flag_parses_and_the_trainer_installs_it(tokenizer, tmp_path):
    from tunesmith.train.stage_trainer import StageTrainer

    argv = ["--data_path", "x.jsonl", "--output_dir", str(tmp_path)]
    assert parse_run("sft", argv, check_paths=False).training.tiled_mlp is False
    training = parse_run("sft", [*argv, "--tiled_mlp", "true"], check_paths=False).training
    assert training.tiled_mlp is True
    model = with_lora(tiny("qwen3", tokenizer))
    StageTrainer(model=model, args=training)
    assert mlp_is_tiled(model)
    plain = with_lora(tiny("qwen3", tokenizer))
    StageTrainer(model=plain, args=parse_run("sft", argv, check_paths=False).training)
    assert not any(getattr(layer.mlp.forward, "tiled_mlp", False) for layer in plain.get_base_model().model.layers)
