"""--experts_implementation: transformers' experts interface (grouped_mm, batched_mm) computes what the eager loop
over the experts computes, on the mixture-of-experts models of tests/helpers/arch_models.py (Qwen3-MoE, Mixtral, gpt-oss):
the loss, the routers' auxiliary loss and the gradient of every trained tensor, for LoRA with the experts' fused
weights adapted through PEFT's target_parameters and for a full fine-tune, float32. The sums run in another order, so
"equal" is to float32 rounding: 1e-6 relative on the losses, and on each gradient tensor 2e-5 of its largest entry
(measured: at most 1.6e-7 on the losses, 2.1e-6 of the largest on a gradient, batched_mm's on gpt-oss). Also: QLoRA (bitsandbytes quantizes
linear layers only, so the experts stay in the load dtype and every kernel runs), an SFT step on packed rows, and the
refusals."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.helpers.arch_models import build_architecture
from tunesmith.errors import ConfigError
from tunesmith.hparams import FinetuningArguments, ModelArguments
from tunesmith.models.loader import load_model

MOE = ("qwen3_moe", "mixtral", "gpt_oss")
KERNELS = ("grouped_mm", "batched_mm")


@pytest.fixture(scope="module", params=MOE)
def moe_dir(request, tmp_path_factory, tokenizer) -> tuple[str, str]:
    return request.param, build_architecture(tmp_path_factory.mktemp(request.param), request.param, tokenizer)


def batch(tokenizer) -> dict[str, torch.Tensor]:
    """Two rows of different lengths, right-padded, every real token a label."""
    generator = torch.Generator().manual_seed(1)
    lengths = (37, 22)
    ids = torch.full((2, max(lengths)), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(100, len(tokenizer) - 100, (n,), generator=generator)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def step(model_dir: str, implementation: str, tokenizer, finetuning: str = "lora", **model_flags) -> dict:
    """Loss, aux loss and the gradient of every trained tensor of one forward and backward through tunesmith's
    loader. LoRA's B starts at zero (A's gradient would be zero too): both get seeded random values first."""
    torch.manual_seed(0)  # LoRA's A
    model = load_model(ModelArguments(model_name_or_path=model_dir, attn_implementation="eager",
                                      experts_implementation=implementation, **model_flags),
                       FinetuningArguments(finetuning_type=finetuning, lora_dropout=0.0))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    assert base.config._experts_implementation == implementation
    if finetuning == "lora":
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    out = model(**batch(tokenizer), output_router_logits=True)
    (out.loss + out.aux_loss).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {"loss": out.loss.item(), "aux_loss": out.aux_loss.item(), "grads": grads}


def assert_same_step(got: dict, eager: dict) -> None:
    assert got["loss"] == pytest.approx(eager["loss"], rel=1e-6)
    assert got["aux_loss"] == pytest.approx(eager["aux_loss"], rel=1e-6)
    assert got["grads"].keys() == eager["grads"].keys()
    for name, reference in eager["grads"].items():
        scale = reference.abs().max().item()
        assert scale > 0, f"{name}: no gradient"
        torch.testing.assert_close(got["grads"][name], reference, rtol=0, atol=2e-5 * scale,
                                   msg=lambda message, name=name: f"{name}: {message}")


@pytest.mark.parametrize("finetuning", ["lora", "full"])
def test_each_kernel_gives_eagers_losses_and_gradients(moe_dir, tokenizer, finetuning):
    _, path = moe_dir
    eager = step(path, "eager", tokenizer, finetuning)
    if finetuning == "lora":  # the experts' fused weights are adapted (PEFT's ParamWrapper), and train
        assert any("experts" in n and "lora_A" in n for n in eager["grads"])
    else:
        assert any(n.endswith("experts.gate_up_proj") for n in eager["grads"])
    for kernel in KERNELS:
        assert_same_step(step(path, kernel, tokenizer, finetuning), eager)


def test_qlora_runs_every_kernel_on_the_unquantized_experts(tmp_path, tokenizer):
    path = build_architecture(tmp_path / "qwen3_moe", "qwen3_moe", tokenizer)
    eager = step(path, "eager", tokenizer, quantization_bit=4)
    for kernel in KERNELS:
        assert_same_step(step(path, kernel, tokenizer, quantization_bit=4), eager)


def test_an_sft_step_on_packed_rows_is_eagers(tmp_path, tokenizer):
    """The whole pipeline: packed rows (tunesmith's varlen attention), the router loss added once per step, a full
    fine-tune with SGD at learning rate 1, so the update is the step's gradient."""
    from transformers import AutoModelForCausalLM

    from tests.core.train.test_moe import CONVERSATIONS, write_data
    from tunesmith.sft.command import run

    path = build_architecture(tmp_path / "qwen3_moe", "qwen3_moe", tokenizer, router_aux_loss_coef=0.25)
    data = write_data(tmp_path / "sft.jsonl", CONVERSATIONS)
    base = AutoModelForCausalLM.from_pretrained(path).state_dict()  # the fused experts, as the trained model holds them
    steps = {}
    for kernel in ("eager", "grouped_mm"):
        trainer = run(["--model_name_or_path", path, "--data_path", data, "--output_dir", str(tmp_path / kernel),
                       "--experts_implementation", kernel, "--packing", "true", "--per_device_train_batch_size", "6",
                       "--finetuning_type", "full", "--max_steps", "1", "--optim", "sgd", "--learning_rate", "1",
                       "--lr_scheduler_type", "constant", "--weight_decay", "0", "--max_grad_norm", "0",
                       "--bf16", "false", "--logging_steps", "1", "--save_strategy", "no", "--plot_loss", "false",
                       "--seed", "0", "--report_to", "none"])
        state = trainer.model.state_dict()
        steps[kernel] = {"loss": trainer.state.log_history[0]["loss"],
                         "aux_loss": trainer.state.log_history[0]["aux_loss"],
                         "grads": {k: base[k] - state[k] for k in base}}
    assert trainer.model.config._attn_implementation.endswith("_varlen")  # the 6 conversations as one packed row
    assert_same_step(steps["grouped_mm"], steps["eager"])


def test_grouped_mm_on_rows_it_cannot_multiply_is_refused_or_falls_back_to_eager(tmp_path, tokenizer, caplog):
    # down_proj's rows of 30 float32 values are 120 bytes: torch's grouped_mm raises "strides should be multiple of 16
    # bytes" (gate_up_proj's 60 are 240, a multiple)
    path = build_architecture(tmp_path / "odd", "qwen3_moe", tokenizer, moe_intermediate_size=30)
    args = {"model_name_or_path": path, "attn_implementation": "eager"}
    with pytest.raises(ConfigError, match=r"^--experts_implementation grouped_mm: torch's grouped_mm needs each expert "
                       r"matrix's rows to be a multiple of 16 bytes, and model\.layers\.0\.mlp\.experts\.down_proj "
                       r"\[4, 64, 30\] float32 is not; use eager or batched_mm \(or auto\)$"):
        load_model(ModelArguments(**args, experts_implementation="grouped_mm"), FinetuningArguments(lora_dropout=0.0))
    with caplog.at_level(logging.INFO):
        model = load_model(ModelArguments(**args), FinetuningArguments(lora_dropout=0.0))
    assert model.get_base_model().config._experts_implementation == "eager"
    assert "experts: eager (auto: grouped_mm cannot multiply model.layers.0.mlp.experts.down_proj" in caplog.text


def test_auto_takes_grouped_mm_and_a_dense_model_says_the_flag_does_nothing(tmp_path, tokenizer, tiny_model_dir,
                                                                             caplog):
    path = build_architecture(tmp_path / "mixtral", "mixtral", tokenizer)
    with caplog.at_level(logging.INFO):
        model = load_model(ModelArguments(model_name_or_path=path, attn_implementation="eager"),
                           FinetuningArguments(lora_dropout=0.0))
    assert model.get_base_model().config._experts_implementation == "grouped_mm"
    assert "experts: grouped_mm (--experts_implementation auto)" in caplog.text
    with caplog.at_level(logging.WARNING):
        load_model(ModelArguments(model_name_or_path=tiny_model_dir, experts_implementation="batched_mm"),
                   FinetuningArguments())
    assert "--experts_implementation batched_mm does nothing: llama is not a mixture of experts" in caplog.text


def test_a_moe_class_outside_the_experts_interface_refuses_a_named_kernel(monkeypatch):
    from transformers import CONFIG_MAPPING, Qwen3MoeForCausalLM

    from tunesmith.models.moe import experts_load_kwargs

    config = CONFIG_MAPPING["qwen3_moe"](num_experts=4)
    assert experts_load_kwargs("auto", config) == {"experts_implementation": "grouped_mm"}
    monkeypatch.setattr(Qwen3MoeForCausalLM, "_can_set_experts_implementation_cached_value", False)
    assert experts_load_kwargs("auto", config) == {"experts_implementation": "eager"}
    with pytest.raises(ConfigError, match=r"^--experts_implementation batched_mm: Qwen3MoeForCausalLM runs its experts "
                       r"in its own loop, not through transformers' experts interface; use eager \(or auto\)$"):
        experts_load_kwargs("batched_mm", config)


def test_the_plan_counts_batched_mms_copies_of_the_experts_and_refuses_eager(tmp_path):
    """batched_mm gathers each (token, chosen expert)'s weights, [tokens x top-k, 2I, H] and [.., H, I], and keeps
    them for backward: the plan's kept bytes grow by exactly that (bf16, as on a GPU) over grouped_mm's."""
    from transformers import CONFIG_MAPPING

    from tunesmith.plan.command import run

    hidden, inter, top_k, layers, tokens = 64, 32, 4, 2, 256
    CONFIG_MAPPING["qwen3_moe"](hidden_size=hidden, intermediate_size=128, moe_intermediate_size=inter, num_experts=8,
                                num_experts_per_tok=top_k, num_hidden_layers=layers, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=4096,
                                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                pad_token_id=2).save_pretrained(tmp_path)
    flags = ["--model_name_or_path", str(tmp_path), "--packing", "true", "--plan_tokens", str(tokens),
             "--lora_dropout", "0", "--gradient_checkpointing", "false", "--experts_implementation"]
    kept = {kernel: run([*flags, kernel])[0][tokens].backbone_kept for kernel in ("grouped_mm", "batched_mm")}
    copies = layers * tokens * top_k * (2 * inter * hidden + hidden * inter) * 2
    assert kept["batched_mm"] - kept["grouped_mm"] == pytest.approx(copies, rel=0.02)
    with pytest.raises(ConfigError, match=r"^tunesmith plan: qwen3_moe's eager experts loop depends on which experts "
                       r"real tokens pick"):
        run([*flags, "eager"])
