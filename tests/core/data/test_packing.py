"""Padding-free packing: the packed row trains exactly what the padded batch trains (per-example
losses, no attention across examples, no label across a boundary, the same loss normalization),
and the SFT recipe wires it in."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.collator import PackingCollator, PaddingCollator
from tunesmith.data.template import encode_conversation
from tunesmith.errors import ConfigError
from tunesmith.hparams import TrainingArguments, check
from tunesmith.models.attention import (
    VARLEN_EAGER,
    VARLEN_SDPA,
    register_varlen_attention,
    use_varlen_attention,
)

ATTENTIONS = ["sdpa", VARLEN_SDPA, "eager", VARLEN_EAGER]


def conversation(i: int) -> list[dict]:
    words = " ".join(f"word{i}x{k}" for k in range(3 + 7 * i))
    return [{"role": "user", "content": f"Question {i}: {words}?"},
            {"role": "assistant", "content": f"Answer {i}: {words[: 20 + 9 * i]}."}]


def chat_examples(tokenizer) -> list[dict]:
    """Four chat examples of different lengths (63, 96, 136 and 176 tokens with SmolLM2's template), labelled on
    the assistant replies only."""
    out = []
    for i in range(4):
        enc = encode_conversation(tokenizer, conversation(i), "assistant")
        out.append({"input_ids": enc.input_ids, "labels": enc.labels})
    return out


@pytest.fixture(scope="module")
def examples(tokenizer) -> list[dict]:
    return chat_examples(tokenizer)


@pytest.fixture(scope="module")
def tiny_models(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    register_varlen_attention()
    models = {}
    for attn in ATTENTIONS:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn, dtype=torch.float32)
        models[attn] = model.train()  # as the Trainer runs it (a KV cache is built unless the batch says not to)
    return models


def test_collator_flattens_a_batch_into_one_row(examples):
    batch = PackingCollator(trained_logits_only=False)(examples)
    lengths = [len(e["input_ids"]) for e in examples]
    total = sum(lengths)
    assert len(set(lengths)) == len(lengths)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (1, total)
    assert "attention_mask" not in batch and batch["use_cache"] is False  # either hides the packed format
    assert batch["input_ids"][0].tolist() == sum((e["input_ids"] for e in examples), [])
    assert batch["position_ids"][0].tolist() == sum((list(range(n)) for n in lengths), [])
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    assert batch["cu_seq_lens_q"].tolist() == [*starts, total]
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["max_length_q"] == batch["max_length_k"] == max(lengths)
    labels = batch["labels"][0].tolist()
    for start, example in zip(starts, examples):
        assert labels[start] == IGNORE_INDEX  # nothing is trained across a boundary
        assert labels[start + 1: start + len(example["labels"])] == example["labels"][1:]


def test_boundary_label_is_ignored_even_when_the_first_token_is_trained(examples):
    trained_everywhere = [{"input_ids": e["input_ids"], "labels": list(e["input_ids"])} for e in examples]
    batch = PackingCollator()(trained_everywhere)
    lengths = [len(e["input_ids"]) for e in examples]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    assert [batch["labels"][0, s].item() for s in starts] == [IGNORE_INDEX] * len(starts)
    # The last token of each example predicts nothing: its next token belongs to the next example.
    kept = set(batch["logits_to_keep"].tolist())
    assert not kept & {s - 1 for s in starts[1:]} and sum(lengths) - 1 not in kept


def test_trained_targets_are_those_of_the_padded_batch(examples):
    """The Trainer normalizes by the count of trained targets: `shift_labels` for a packed batch,
    `labels[..., 1:]` for a padded one. Both must count, and hold, the same targets."""
    packed = PackingCollator()(examples)
    padded = PaddingCollator(pad_token_id=0)(examples)
    padded_targets = padded["labels"][:, 1:]
    assert packed["shift_labels"].tolist() == padded_targets[padded_targets != IGNORE_INDEX].tolist()
    assert packed["logits_to_keep"].numel() == packed["shift_labels"].numel() > 0


def test_logits_to_keep_is_an_index_every_transformers_5_slices(examples):
    """Up to transformers 5.20 a causal-LM head slices `hidden_states[:, logits_to_keep, :]`: a boolean
    [1, tokens] mask raises IndexError there (on a CPU too), 1-D positions work, and newer releases
    (slice_logits_to_keep) take those the same way. So the collators give positions, whatever the
    installed release does with a mask (scripts/test_floors.sh runs the models at the floor)."""
    from tunesmith.data.collator import PreferencePackingCollator

    packed = PackingCollator()(examples)
    pair = {"chosen_ids": examples[0]["input_ids"], "chosen_start": 3, "chosen_end": 9,
            "rejected_ids": examples[1]["input_ids"], "rejected_start": 4, "rejected_end": 7}
    preference = PreferencePackingCollator()([pair])
    for batch, kept in ((packed, packed["shift_labels"].numel()), (preference, 6 + 3)):
        keep = batch["logits_to_keep"]
        assert keep.dtype == torch.long and keep.ndim == 1 and keep.numel() == kept
        hidden = torch.randn(1, batch["input_ids"].shape[1], 4)
        assert hidden[:, keep, :].shape == (1, kept, 4)  # the <= 5.20 slicing


def per_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy at every position of one row (0 where the next label is ignored)."""
    targets = torch.cat([labels[1:], torch.tensor([IGNORE_INDEX])])
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="none")


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_packed_per_example_loss_equals_unpacked(tiny_models, examples, attn):
    model = tiny_models[attn]
    batch = PackingCollator(trained_logits_only=False)(examples)
    with torch.no_grad():
        packed_logits = model(**batch).logits[0]
        losses = per_token_loss(packed_logits, batch["labels"][0])
        start = 0
        for example in examples:
            n = len(example["input_ids"])
            alone = model(input_ids=torch.tensor([example["input_ids"]]), labels=torch.tensor([example["labels"]]))
            trained = sum(lab != IGNORE_INDEX for lab in example["labels"][1:])
            assert losses[start:start + n].sum() / trained == pytest.approx(alone.loss.item(), rel=1e-5)
            start += n


@pytest.mark.parametrize("attn", ATTENTIONS)
def test_no_attention_leaks_between_packed_examples(tiny_models, examples, attn):
    model = tiny_models[attn]
    first_len = len(examples[0]["input_ids"])
    changed = [{**examples[0], "input_ids": [(t + 7) % 1000 + 10 for t in examples[0]["input_ids"]]}, *examples[1:]]
    with torch.no_grad():
        collate = PackingCollator(trained_logits_only=False)
        batch, batch_changed = collate(examples), collate(changed)
        rest = model(**batch).logits[0, first_len:]
        rest_changed = model(**batch_changed).logits[0, first_len:]
        torch.testing.assert_close(rest_changed, rest, rtol=1e-5, atol=1e-5)
        # The check can fail: one causal sequence over the same row does see the changed tokens.
        plain = model(input_ids=batch["input_ids"]).logits[0, first_len:]
        plain_changed = model(input_ids=batch_changed["input_ids"]).logits[0, first_len:]
        assert (plain - plain_changed).abs().max() > 1e-3


@pytest.mark.parametrize("attn", ["sdpa", VARLEN_SDPA])
def test_logits_of_trained_positions_only_give_the_same_loss_and_gradients(tiny_model_dir, examples, attn):
    from transformers import AutoModelForCausalLM

    register_varlen_attention()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn, dtype=torch.float32)
    full, trimmed = PackingCollator(trained_logits_only=False)(examples), PackingCollator()(examples)
    num_items = trimmed["shift_labels"].numel()
    results = []
    for batch in (full, trimmed):
        model.zero_grad()
        out = model(**batch, num_items_in_batch=num_items)
        out.loss.backward()
        results.append((out.loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (loss_full, grads_full), (loss_trim, grads_trim) = results
    assert trimmed["logits_to_keep"].numel() < trimmed["input_ids"].numel() / 2  # prompts are most of the row
    torch.testing.assert_close(loss_trim, loss_full, rtol=1e-6, atol=1e-6)
    assert len(grads_trim) == len(grads_full) > 0
    for g_trim, g_full in zip(grads_trim, grads_full):
        torch.testing.assert_close(g_trim, g_full, rtol=1e-4, atol=1e-6)


def test_varlen_attention_leaves_padded_batches_to_sdpa(tiny_models, examples):
    batch = PaddingCollator(pad_token_id=0)(examples)
    with torch.no_grad():
        sdpa = tiny_models["sdpa"](**batch).logits
        varlen = tiny_models[VARLEN_SDPA](**batch).logits
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(varlen[mask], sdpa[mask])


def test_use_varlen_attention_switches_sdpa_and_eager(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    sdpa = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa"),
                          LoraConfig(r=2, target_modules=["q_proj"]))
    assert use_varlen_attention(sdpa) == VARLEN_SDPA
    assert sdpa.get_base_model().config._attn_implementation == VARLEN_SDPA
    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager")
    assert use_varlen_attention(eager) == VARLEN_EAGER  # transformers' eager finds no packed rows in gpt-oss


def write_conversations(path, n: int) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"messages": conversation(i % 5)}) + "\n")
    return str(path)


def test_packed_and_padded_runs_train_the_same_objective(tiny_model_dir, tmp_path, monkeypatch):
    """Same data, same steps, gradient accumulation over two batches, float32: the logged losses,
    gradient norms and trained-token counts of a packed run, in one forward per batch or in one forward
    per example (--max_forward_tokens 1), equal those of a padded run."""
    from tunesmith.sft.command import run as main

    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    data = write_conversations(tmp_path / "train.jsonl", 8)
    histories = {}
    runs = {"padded": ["--packing", "false"], "packed": ["--packing", "true", "--max_forward_tokens", "0"],
            "split": ["--packing", "true", "--max_forward_tokens", "1"]}
    for name, flags in runs.items():
        trainer = main([
            "--model_name_or_path", tiny_model_dir, "--data_path", data, "--output_dir", str(tmp_path / name),
            *flags, "--max_steps", "2", "--per_device_train_batch_size", "2", "--bf16", "false",
            "--gradient_accumulation_steps", "2", "--learning_rate", "1e-2", "--lora_dropout", "0",
            "--train_sampling_strategy", "sequential", "--save_strategy", "no", "--plot_loss", "false",
            "--report_to", "none",
        ])
        histories[name] = [h for h in trainer.state.log_history if "loss" in h]
        attn = trainer.model.get_base_model().config._attn_implementation
        assert attn == (VARLEN_SDPA if name != "padded" else "sdpa")
    padded = histories["padded"]
    assert len(padded) == 2
    for name in ("packed", "split"):
        assert len(histories[name]) == 2
        for a, b in zip(padded, histories[name]):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), name
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), name
            assert b["trained_tokens"] == a["trained_tokens"], name


def test_liger_kernel_needs_the_package_and_a_gpu(tmp_path):
    import importlib.util

    args = TrainingArguments(output_dir=str(tmp_path), use_liger_kernel=True)
    if importlib.util.find_spec("liger_kernel") is not None and torch.cuda.is_available():
        check(training=args)
        return
    with pytest.raises(ConfigError, match="--use_liger_kernel needs a CUDA GPU and the liger-kernel package"):
        check(training=args)


@pytest.mark.slow
def test_real_model_packed_lora_loss_equals_padded(default_model_path, examples):
    """The default model (GQA, 30 layers) with a LoRA adapter, as SFT trains it: the packed row
    (sdpa_varlen, logits of trained positions only) gives the padded batch's loss."""
    from tunesmith.hparams import FinetuningArguments, ModelArguments
    from tunesmith.models.loader import load_model

    model = load_model(ModelArguments(model_name_or_path=default_model_path),
                       FinetuningArguments(lora_r=4, lora_dropout=0.0), TrainingArguments(output_dir="unused"))
    padded, packed = PaddingCollator(pad_token_id=0)(examples[:3]), PackingCollator()(examples[:3])
    num_items = packed["shift_labels"].numel()
    with torch.no_grad():
        loss_padded = model(**padded, num_items_in_batch=num_items).loss
        use_varlen_attention(model)
        loss_packed = model(**packed, num_items_in_batch=num_items).loss
    assert model.get_base_model().config._attn_implementation == VARLEN_SDPA
    assert loss_packed.item() == pytest.approx(loss_padded.item(), rel=1e-5)


def test_packed_kernel_is_chosen_by_device_and_logged_once(tiny_models, examples, caplog, monkeypatch):
    """The CPU keeps SDPA per example in every precision, autocast included (torch's flash varlen kernel is
    CUDA's; tests/system/test_gpu.py checks it there); the kernel a run's packed rows use is logged once."""
    import logging

    from tunesmith.models import attention

    q, k = torch.randn(1, 4, 10, 16, dtype=torch.bfloat16), torch.randn(1, 2, 10, 16, dtype=torch.bfloat16)
    assert attention.packed_kernel(q, k) == attention.SDPA_PER_EXAMPLE
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention.attention_dtype(q.float()) == torch.float32  # CPU autocast: not CUDA's cast
        assert attention.packed_kernel(q.float(), k.float()) == attention.SDPA_PER_EXAMPLE
    monkeypatch.setattr(attention, "_reported", set())
    batch = PackingCollator(trained_logits_only=False)(examples)
    with caplog.at_level(logging.INFO, logger="tunesmith.models.attention"), torch.no_grad():
        tiny_models[VARLEN_SDPA](**batch)
        tiny_models[VARLEN_SDPA](**batch)
    lines = [r.getMessage() for r in caplog.records if r.name == "tunesmith.models.attention"]
    assert lines == ["packed rows attend with SDPA per example"]
