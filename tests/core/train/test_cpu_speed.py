"""The CPU fast path of LoRA training: bf16 where the CPU computes it (auto), LoRA's dropout with cheaper
random numbers, and packed batches run as several forwards. Each is the same training as the plain
float32 path: the dropout draws the same distribution, the split forwards give the same gradients, and
bf16 keeps the loss curve within a stated tolerance of float32."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tunesmith.data.collator import PackingCollator
from tunesmith.data.packing import FORWARD_SPLITS, forward_splits, slice_packed_row
from tunesmith.hparams import FinetuningArguments, ModelArguments, TrainingArguments
from tunesmith.models import lora_dropout
from tunesmith.models.loader import load_model, resolve_dtype
from tunesmith.models.lora_dropout import FastDropout, keep_mask, use_fast_lora_dropout
from tunesmith.utils import hardware

DEMO = "data/demo/sft.jsonl"

# ---------------------------------------------------------------- dropout


def test_keep_mask_drops_each_element_with_probability_p():
    torch.manual_seed(0)
    for p in (0.05, 0.3, 0.7):
        mask = keep_mask(torch.Size([2000, 1001]), p)
        assert mask.dtype == torch.bool and mask.shape == (2000, 1001)
        assert abs(1 - mask.float().mean().item() - p) < 2e-3, p


def test_keep_mask_drops_are_independent():
    torch.manual_seed(1)
    mask = keep_mask(torch.Size([4_000_000]), 0.5).float()
    assert abs((mask[1:] == mask[:-1]).float().mean().item() - 0.5) < 2e-3  # neighbours agree as coins do
    # the number dropped varies as a binomial's does: a fixed number of draws would vary less
    dropped = torch.stack([(~keep_mask(torch.Size([100]), 0.3)).sum() for _ in range(4000)]).float()
    assert dropped.mean().item() == pytest.approx(30, abs=0.4)
    assert dropped.var().item() == pytest.approx(100 * 0.3 * 0.7, rel=0.1)


def test_fast_dropout_is_unbiased_and_backward_uses_the_same_mask():
    torch.manual_seed(0)
    dropout = FastDropout(0.2).train()
    x = torch.randn(500, 400, requires_grad=True)
    out = dropout(x)
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.8) < 3e-3
    torch.testing.assert_close(out[kept], x[kept] / 0.8)
    ones = torch.ones(1000, 1000)  # E[dropout(x)] = x
    assert abs(dropout(ones).mean().item() - 1.0) < 3e-3
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad, kept.float() / 0.8)
    dropout.eval()
    assert dropout(x) is x


def test_fast_dropout_is_reproducible_under_a_seed():
    dropout = FastDropout(0.1).train()
    x = torch.randn(64, 64)
    torch.manual_seed(3)
    a = dropout(x)
    torch.manual_seed(3)
    b = dropout(x)
    assert torch.equal(a, b)


def test_loader_swaps_lora_dropout_for_training_on_cpu_only(tiny_model_dir, tmp_path):
    model_args = ModelArguments(model_name_or_path=tiny_model_dir)
    lora = FinetuningArguments(lora_r=4, lora_alpha=8, lora_dropout=0.1)
    trained = load_model(model_args, lora, TrainingArguments(output_dir=str(tmp_path), bf16=False))
    dropouts = [d for m in trained.modules() if isinstance(getattr(m, "lora_dropout", None), nn.ModuleDict)
                for d in m.lora_dropout.values()]
    assert dropouts and all(type(d) is FastDropout and d.p == 0.1 for d in dropouts)
    assert use_fast_lora_dropout(trained) == 0  # nothing left to swap
    # the saved adapter is PEFT's own: the configured dropout, no extra keys
    trained.save_pretrained(tmp_path / "adapter")
    from peft import PeftConfig
    from safetensors.torch import load_file

    assert PeftConfig.from_pretrained(tmp_path / "adapter").lora_dropout == 0.1
    assert all("lora_A" in k or "lora_B" in k for k in load_file(tmp_path / "adapter" / "adapter_model.safetensors"))
    inference = load_model(ModelArguments(model_name_or_path=tiny_model_dir, adapter_name_or_path=str(tmp_path / "adapter")),
                           lora, is_trainable=False)
    assert not any(isinstance(m, FastDropout) for m in inference.modules())


def test_lora_input_cast_is_skipped_only_under_autocast():
    flag = lora_dropout._CastOutsideAutocast()
    assert bool(flag)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not bool(flag)


# ---------------------------------------------------------------- bf16 auto


def test_bf16_auto_follows_the_hardware_for_sft_only(tmp_path, monkeypatch):
    import tunesmith.hparams.training_args as training_args_module
    from tunesmith.hparams import SFTTrainingArguments

    monkeypatch.setattr(training_args_module, "native_bf16", lambda on_cpu: True)
    assert SFTTrainingArguments(output_dir=str(tmp_path)).bf16 is True
    assert SFTTrainingArguments(output_dir=str(tmp_path), bf16=False).bf16 is False
    assert SFTTrainingArguments(output_dir=str(tmp_path), deepspeed="configs/ds_zero2.json", use_cpu=True).bf16 is False
    assert TrainingArguments(output_dir=str(tmp_path)).bf16 is False  # reward, DPO, PPO: float32 unless asked
    monkeypatch.setattr(training_args_module, "native_bf16", lambda on_cpu: False)
    assert SFTTrainingArguments(output_dir=str(tmp_path)).bf16 is False
    assert SFTTrainingArguments(output_dir=str(tmp_path), bf16=True).bf16 is True


def test_native_bf16_on_this_cpu_is_what_the_cpu_reports():
    flags = open("/proc/cpuinfo", encoding="ascii").read()
    assert hardware.native_bf16(on_cpu=True) == ("avx512_bf16" in flags or "amx_bf16" in flags)


def test_a_gpu_that_only_emulates_bf16_is_not_given_bf16(monkeypatch):
    """A T4 or V100 (compute capability 7.x) makes bfloat16 tensors, emulated: torch.cuda.is_bf16_supported() says
    yes by default; `auto` wants the hardware's own (8.0 and newer)."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)  # emulation works
    for major, native in ((7, False), (8, True)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, m=major: SimpleNamespace(major=m))
        assert hardware.native_bf16(on_cpu=False) is native


def test_bf16_keeps_trained_weights_in_float32(tiny_model_dir, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), bf16=True, use_cpu=True)
    model_args = ModelArguments(model_name_or_path=tiny_model_dir)
    assert resolve_dtype(model_args, args) == torch.bfloat16  # a frozen base
    assert resolve_dtype(model_args, args, trains_base=True) == torch.float32  # full fine-tuning on CPU
    lora = load_model(model_args, FinetuningArguments(lora_r=4, lora_alpha=8), args)
    frozen = {p.dtype for p in lora.parameters() if not p.requires_grad}
    trained = {p.dtype for p in lora.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    reward = load_model(model_args, FinetuningArguments(lora_r=4, lora_alpha=8), args, task="reward")
    head = [p for n, p in reward.named_parameters() if "score" in n and p.requires_grad]
    assert head and all(p.dtype == torch.float32 for p in head)
    full = load_model(model_args, FinetuningArguments(finetuning_type="full"), args)
    assert {p.dtype for p in full.parameters()} == {torch.float32}


# ---------------------------------------------------------------- forwards of whole examples


def test_forward_splits_cut_between_whole_examples_within_the_budget():
    assert forward_splits([100, 200, 300, 50], 512) == [0, 300, 650]
    assert forward_splits([600, 10, 10], 512) == [0, 600, 620]  # too long for the budget: alone
    assert forward_splits([100, 100], 512) == [0, 200]
    assert forward_splits([5, 5, 5], 1) == [0, 5, 10, 15]
    lengths = [37, 210, 5, 512, 90, 90, 400]
    cuts = forward_splits(lengths, 512)
    assert cuts[-1] == sum(lengths)
    ends = set(torch.as_tensor([0, *lengths]).cumsum(0).tolist())
    assert set(cuts) <= ends  # only at example boundaries
    parts = [b - a for a, b in zip(cuts, cuts[1:])]
    assert all(n <= 512 for n in parts)


def examples_of(tokenizer, n: int) -> list[dict]:
    from tunesmith.data.template import encode_conversation

    out = []
    for i in range(n):
        words = " ".join(f"w{i}x{k}" for k in range(4 + 9 * i))
        enc = encode_conversation(tokenizer, [{"role": "user", "content": f"Q{i}: {words}?"},
                                              {"role": "assistant", "content": f"A{i}: {words[: 30 + 7 * i]}."}],
                                  "assistant")
        out.append({"input_ids": enc.input_ids, "labels": enc.labels})
    return out


def test_a_row_run_as_several_forwards_gives_the_loss_and_gradients_of_one(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from tunesmith.models.attention import register_varlen_attention

    register_varlen_attention()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa_varlen", dtype=torch.float32)
    examples = examples_of(tokenizer, 4)
    whole = PackingCollator()(examples)
    split = PackingCollator(max_forward_tokens=max(len(e["input_ids"]) for e in examples))(examples)
    assert FORWARD_SPLITS not in whole and len(split[FORWARD_SPLITS]) > 2
    num_items = whole["shift_labels"].numel()

    model.zero_grad()
    loss_whole = model(**whole, num_items_in_batch=num_items).loss
    loss_whole.backward()
    grads_whole = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    cuts = split.pop(FORWARD_SPLITS)
    loss_parts = 0.0
    for start, end in zip(cuts, cuts[1:]):
        part = slice_packed_row(split, start, end)
        assert int(part["cu_seq_lens_q"][-1]) == part["input_ids"].shape[1] == end - start
        loss = model(**part, num_items_in_batch=num_items).loss
        loss.backward()
        loss_parts += loss.item()
    assert loss_parts == pytest.approx(loss_whole.item(), rel=1e-5)
    for p, g in zip(model.parameters(), grads_whole):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


def test_max_forward_tokens_rules(tmp_path):
    from tunesmith.errors import ConfigError
    from tunesmith.hparams import SFTDataArguments, check

    with pytest.raises(ConfigError, match="--max_forward_tokens 256 splits packed batches: add --packing true"):
        check(data=SFTDataArguments(data_path=[DEMO], max_forward_tokens=256))
    with pytest.raises(ConfigError, match="cannot be used with --deepspeed"):
        check(data=SFTDataArguments(data_path=[DEMO], max_forward_tokens=256, packing=True),
              training=TrainingArguments(output_dir=str(tmp_path), deepspeed="configs/ds_zero2.json"))
    check(data=SFTDataArguments(data_path=[DEMO], max_forward_tokens=0, packing=True),
          training=TrainingArguments(output_dir=str(tmp_path), deepspeed="configs/ds_zero2.json"))


# ---------------------------------------------------------------- the chunked loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_is_transformers_loss_with_the_same_gradients(dtype, monkeypatch):
    from transformers.loss.loss_utils import ForCausalLMLoss

    from tunesmith.train import losses

    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 7 * 300)  # 7 rows a chunk: chunks end mid-sequence
    torch.manual_seed(0)
    logits = (4 * torch.randn(2, 37, 300)).to(dtype).requires_grad_()
    labels = torch.randint(0, 300, (2, 37))
    labels[0, :9] = labels[1, 30:] = -100
    targets = torch.cat([labels[:, 1:], torch.full((2, 1), -100)], 1)
    for kwargs in ({}, {"num_items_in_batch": 50}, {"shift_labels": targets, "num_items_in_batch": torch.tensor(61)}):
        expected = ForCausalLMLoss(logits, labels, 300, **kwargs)
        (expected_grad,) = torch.autograd.grad(expected * 3, logits)
        got = losses.causal_lm_loss(logits, labels, 300, **kwargs)
        (grad,) = torch.autograd.grad(got * 3, logits)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert grad.dtype == dtype
        tolerance = 1e-6 if dtype == torch.float32 else 4e-3
        torch.testing.assert_close(grad, expected_grad, rtol=tolerance, atol=tolerance)
        assert grad[0, :8].abs().max() == 0  # rows without a target get no gradient


def test_sft_trainer_computes_the_loss_chunked_on_cpu(tiny_model_dir, tmp_path, monkeypatch):
    from tunesmith.sft.command import run
    from tunesmith.train.losses import causal_lm_loss

    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    trainer = run(["--model_name_or_path", tiny_model_dir, "--data_path", DEMO, "--output_dir", str(tmp_path / "out"),
                   "--max_steps", "1", "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none",
                   "--max_samples", "8"])
    assert trainer.model.get_base_model().loss_function is causal_lm_loss


# ---------------------------------------------------------------- bf16 against float32, whole runs

# The stated tolerance: on the demo conversations, every step's loss of the fast path (bf16 autocast
# over a bf16 base, packed rows split into forwards, the chunked loss) is within 1% of the float32
# path's (padded batches, float32 throughout). Without dropout, so that the two see the same noise
# (none); measured 0.4% at most here. On the real model benchmarks/sft.py prints the largest
# difference per variant (`loss vs plain`; `--lora_dropout 0` for the like-for-like curve).
LOSS_TOLERANCE = 0.01


@pytest.mark.heavy  # a training curve twice (~2 min loaded); the fast path's pieces are exact in seconds above; -m heavy
def test_the_fast_path_follows_the_float32_loss_curve(tokenizer, tmp_path, monkeypatch):
    from tests.helpers.tiny_models import build_tiny_model_dir
    from tunesmith.sft.command import run

    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    # Embeddings large enough for the logits to move: with the default 0.02 a tiny model's loss stays at log(vocab).
    model_dir = build_tiny_model_dir(tmp_path / "model", tokenizer, initializer_range=0.2)
    common = ["--model_name_or_path", model_dir, "--data_path", DEMO, "--max_steps", "12",
              "--per_device_train_batch_size", "4", "--learning_rate", "2e-2", "--lora_r", "8", "--lora_alpha", "16", "--max_samples", "8",
              "--train_sampling_strategy", "sequential", "--save_strategy", "no", "--plot_loss", "false",
              "--report_to", "none", "--seed", "0", "--lora_dropout", "0"]
    fast = run(common + ["--output_dir", str(tmp_path / "fast"), "--packing", "true", "--bf16", "true",
                         "--max_forward_tokens", "200"])
    assert fast.args.bf16
    plain = run(common + ["--output_dir", str(tmp_path / "plain"), "--bf16", "false"])
    fast_losses = [h["loss"] for h in fast.state.log_history if "loss" in h]
    plain_losses = [h["loss"] for h in plain.state.log_history if "loss" in h]
    assert len(fast_losses) == len(plain_losses) == 12
    assert plain_losses[-1] < plain_losses[0] - 0.5  # the curve moves: the comparison means something
    for step, (a, b) in enumerate(zip(fast_losses, plain_losses), 1):
        assert a == pytest.approx(b, rel=LOSS_TOLERANCE), f"step {step}: fast {a:.4f} against float32 {b:.4f}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_lm_head_gets_contiguous_rows_when_logits_are_kept_for_the_last_positions(tiny_model_dir, dtype):
    """RL log-probs and batched prefills ask for the last k positions' logits (`logits_to_keep=k`), which
    transformers slices out of the hidden states as a strided view; the loaded model's head must see them
    contiguous (models/output_head.py: else CPU's linear copies the whole head once per row) and give the
    same logits as the full forward."""
    model = load_model(ModelArguments(model_name_or_path=tiny_model_dir, dtype=dtype), FinetuningArguments(),
                       is_trainable=False)
    seen = []
    model.get_output_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    ids = torch.randint(5, 500, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        kept = model(input_ids=ids, logits_to_keep=4).logits
        full = model(input_ids=ids).logits
    assert seen == [True, True]
    assert kept.shape == (3, 4, full.shape[-1])
    torch.testing.assert_close(kept, full[:, -4:], rtol=0, atol=1e-2 if dtype == "bfloat16" else 1e-5)
