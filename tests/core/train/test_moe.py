"""Mixture-of-experts SFT on tiny random Qwen3-MoE, Mixtral and gpt-oss models: the routers' load-balancing loss is
in the objective with the model's coefficient, once per optimizer step whatever the accumulation or packing, and
logged as aux_loss; LoRA trains the experts' fused weights (or names them when it cannot), and those adapters
reload and merge."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

from tunesmith.data.template import encode_conversation
from tunesmith.errors import ConfigError
from tunesmith.hparams import parse_run
from tunesmith.merge.command import run as merge_main
from tunesmith.models.loader import find_lora_targets
from tunesmith.models.moe import expert_lora_parameters, fused_expert_parameters
from tunesmith.sft.command import run as sft_main
from tunesmith.train import stage_trainer
from tunesmith.train.router_loss import router_loss_for

# Per architecture: its config's expert fields, the router weight's name in a layer, and what loading needs
# (gpt-oss has no sdpa in transformers; its packed rows are models/attention.py's business, so it trains padded).
ARCHITECTURES = {
    "qwen3_moe": ({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}, "mlp.gate.weight", ()),
    "mixtral": ({"num_local_experts": 4, "num_experts_per_tok": 2}, "mlp.gate.weight", ()),
    "gpt_oss": ({"num_local_experts": 4, "num_experts_per_tok": 2}, "mlp.router.weight",
                ("--attn_implementation", "eager", "--packing", "false")),
}
CONVERSATIONS = [[{"role": "user", "content": f"What is {a} plus {b}?"},
                  {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}] for a in range(2) for b in range(3)]


def build_moe_model_dir(path, tokenizer, arch: str, **overrides) -> str:
    """A random 2-layer MoE model of `arch` (4 experts, top-2) with the default model's tokenizer; weights at
    initializer_range 0.2 so that routing differs from token to token."""
    torch.manual_seed(0)
    config = CONFIG_MAPPING[arch](
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **ARCHITECTURES[arch][0], **overrides)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def moe_model(request, tmp_path_factory, tokenizer) -> tuple[str, str]:
    arch = request.param
    return arch, build_moe_model_dir(tmp_path_factory.mktemp(arch), tokenizer, arch)


@pytest.fixture(scope="module")
def qwen3_moe_dir(tmp_path_factory, tokenizer) -> str:
    # a coefficient of its own far above the default 0.001, so the aux loss's share of a gradient is well above
    # float32 rounding
    return build_moe_model_dir(tmp_path_factory.mktemp("qwen3_moe_coef"), tokenizer, "qwen3_moe",
                               router_aux_loss_coef=0.25)


def write_data(path, conversations) -> str:
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    return str(path)


def sft(model_dir, data, out, *extra: str):
    return sft_main(["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
                     "--max_steps", "2", "--per_device_train_batch_size", "3", "--learning_rate", "1e-2",
                     "--save_strategy", "no", "--plot_loss", "false", "--seed", "0", "--report_to", "none", *extra])


def first_update(model_dir, data, out, *extra: str) -> tuple[dict[str, torch.Tensor], stage_trainer.StageTrainer]:
    """(-(the first optimizer update) of every router weight, the trainer) of a full fine-tune with plain SGD at
    learning rate 1 (no clipping, no schedule, float32): the update is the gradient of the step's objective."""
    trainer = sft(model_dir, data, out, "--finetuning_type", "full", "--max_steps", "1", "--optim", "sgd",
                  "--learning_rate", "1", "--lr_scheduler_type", "constant", "--weight_decay", "0",
                  "--max_grad_norm", "0", "--bf16", "false", *extra)
    base = load_file(f"{model_dir}/model.safetensors")
    state = trainer.model.state_dict()
    return {k: base[k] - state[k] for k in base if k.endswith("mlp.gate.weight")}, trainer


def assert_all_close(a: dict, b: dict, rtol: float = 1e-5) -> None:
    assert a.keys() == b.keys() and a
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=rtol * b[key].abs().max().item(),
                                   msg=lambda message, key=key: f"{key}: {message}")


def test_lora_sft_logs_aux_loss_trains_the_experts_and_merges(moe_model, tokenizer, tmp_path, caplog):
    arch, model_dir = moe_model
    router = ARCHITECTURES[arch][1]
    data = write_data(tmp_path / "sft.jsonl", CONVERSATIONS)
    with caplog.at_level(logging.INFO):
        trainer = sft(model_dir, data, tmp_path / "out", "--lora_dropout", "0", *ARCHITECTURES[arch][2])
    logged = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logged) == 2 and all(math.isfinite(r["aux_loss"]) and r["aux_loss"] > 1 for r in logged)
    assert "coefficient 0.001 (" in caplog.text and "router_aux_loss_coef), added once per optimizer step" in caplog.text
    assert all("aux_loss" in json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
               if '"loss"' in line)

    saved = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    expert_b = [k for k in saved if ".experts." in k and "lora_B" in k]
    assert len(expert_b) == 2 * 2  # gate_up_proj and down_proj in both layers; B starts at zero and moved
    assert all(saved[k].abs().sum() > 0 for k in expert_b)
    assert not [k for k in saved if router.rsplit(".", 1)[0] + "." in k]  # the router is no LoRA target

    merged = tmp_path / "merged"
    result = merge_main(["--adapter_name_or_path", str(tmp_path / "out"), "--output_dir", str(merged),
                         *ARCHITECTURES[arch][2][:2]])
    assert result.max_abs_diff < 1e-4
    ids = torch.tensor([encode_conversation(tokenizer, CONVERSATIONS[0]).input_ids])
    load = {"attn_implementation": "eager"} if arch == "gpt_oss" else {}
    with torch.no_grad():
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, **load),
                                            str(tmp_path / "out")).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(model_dir, **load).eval()(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(str(merged), **load).eval()(ids).logits
    torch.testing.assert_close(plain, adapted, atol=1e-4, rtol=0)
    assert (adapted - base).abs().max() > 1e-3  # the adapter changed the model


def test_experts_with_lora_dropout_are_named_as_untrained(moe_model, caplog):
    arch, model_dir = moe_model
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert fused_expert_parameters(model) == ["experts.down_proj", "experts.gate_up_proj"]
    with caplog.at_level(logging.WARNING):
        assert expert_lora_parameters(model, lora_dropout=0.05) == []
    assert "LoRA leaves the experts' fused weights untrained (experts.down_proj, experts.gate_up_proj)" in caplog.text
    assert "--lora_dropout 0 trains them too" in caplog.text
    assert expert_lora_parameters(model, lora_dropout=0.0) == ["experts.down_proj", "experts.gate_up_proj"]


def test_lora_targets_leave_the_routers_out(moe_model):
    # Qwen2-MoE gates its shared expert with a linear layer of one output; the others keep bare router weights
    config = CONFIG_MAPPING["qwen2_moe"](vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                         shared_expert_intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, num_experts=4, num_experts_per_tok=2)
    qwen2_moe = AutoModelForCausalLM.from_config(config)
    assert find_lora_targets(qwen2_moe) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert fused_expert_parameters(qwen2_moe) == ["experts.down_proj", "experts.gate_up_proj"]
    moe = AutoModelForCausalLM.from_pretrained(moe_model[1])
    assert find_lora_targets(moe) == ["k_proj", "o_proj", "q_proj", "v_proj"]


def test_router_loss_is_in_the_objective_with_the_models_coefficient(qwen3_moe_dir, tmp_path, monkeypatch):
    data = write_data(tmp_path / "sft.jsonl", CONVERSATIONS)
    padded = ("--packing", "false", "--per_device_train_batch_size", str(len(CONVERSATIONS)))
    default, trainer = first_update(qwen3_moe_dir, data, tmp_path / "default", *padded)
    zero, zero_trainer = first_update(qwen3_moe_dir, data, tmp_path / "zero", *padded, "--router_aux_loss_coef", "0")
    monkeypatch.setattr(stage_trainer, "router_loss_for", lambda model, flag: None)  # router logits never asked for
    off, _ = first_update(qwen3_moe_dir, data, tmp_path / "off", *padded)

    assert all(torch.equal(zero[k], off[k]) for k in off)
    # the logged loss is the language-model loss alone, the aux loss is logged beside it
    logged, logged_zero = trainer.state.log_history[0], zero_trainer.state.log_history[0]
    assert logged["loss"] == logged_zero["loss"] and logged["aux_loss"] > 1 and "aux_loss" not in logged_zero
    # the difference is the model's coefficient times the gradient of its own aux loss on the batch (which does not
    # depend on the order of the rows nor on their padding)
    model = AutoModelForCausalLM.from_pretrained(qwen3_moe_dir)
    rows = trainer.train_dataset["input_ids"]
    assert len(rows) == len(CONVERSATIONS)  # all in the one batch
    longest = max(map(len, rows))
    ids = torch.tensor([r + [0] * (longest - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows])
    model(input_ids=ids, attention_mask=mask, output_router_logits=True).aux_loss.backward()
    aux_grad = {f"{n}": 0.25 * p.grad for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")}
    assert_all_close({k: default[k] - off[k] for k in off}, aux_grad, rtol=1e-3)
    assert min((default[k] - off[k]).abs().max() for k in off) > 1e-3


def test_aux_loss_counts_once_per_step_whatever_the_accumulation_or_packing(qwen3_moe_dir, tmp_path):
    """Two identical conversations: their batch's aux loss is one conversation's, so one forward of both, two
    accumulated forwards and a packed row run as two forwards must all make the same update; an aux loss added
    whole by every forward (transformers' own way) doubles it in the last two."""
    data = write_data(tmp_path / "sft.jsonl", [CONVERSATIONS[1]] * 2)
    one, _ = first_update(qwen3_moe_dir, data, tmp_path / "one", "--packing", "false",
                       "--per_device_train_batch_size", "2")
    accumulated, _ = first_update(qwen3_moe_dir, data, tmp_path / "accumulated", "--packing", "false",
                               "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2")
    split, _ = first_update(qwen3_moe_dir, data, tmp_path / "split", "--packing", "true",
                            "--per_device_train_batch_size", "2", "--max_forward_tokens", "1")
    assert_all_close(accumulated, one)
    assert_all_close(split, one)


def test_dense_model_has_no_router_loss_and_says_the_flag_does_nothing(tiny_model_dir, caplog):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert router_loss_for(model, None) is None and not caplog.text
    with caplog.at_level(logging.WARNING):
        assert router_loss_for(model, 0.01) is None
    assert "--router_aux_loss_coef 0.01 does nothing: LlamaForCausalLM has no router load-balancing loss" in caplog.text


@pytest.mark.parametrize("kind, argv, message", [
    ("sft", ("--router_aux_loss_coef", "-0.1"), r"--router_aux_loss_coef must be >= 0 \(got -0.1\); 0 leaves"),
    ("dpo", ("--router_aux_loss_coef", "0.01"), r"--router_aux_loss_coef .* only SFT adds, and this is a dpo run"),
])
def test_bad_router_aux_loss_coef_stops_early(kind, argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_run(kind, ["--data_path", "x.jsonl", *argv], check_paths=False)
