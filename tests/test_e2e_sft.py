"""End to end on the real SmolLM2-135M-Instruct: LoRA SFT on demo conversations lowers the loss and
leaves an adapter that loads back and generates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tunesmith.recipes.sft import main as sft_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_lora_sft_on_real_model_lowers_loss(tmp_path, default_model_path):
    out = tmp_path / "sft"
    trainer = sft_main([
        "--data_path", str(ROOT / "data/demo/sft.jsonl"), "--max_samples", "24", "--output_dir", str(out),
        "--max_steps", "6", "--per_device_train_batch_size", "4", "--learning_rate", "1e-3",
        "--max_seq_length", "192", "--logging_steps", "1", "--save_strategy", "no", "--seed", "0",
    ])
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 6
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 * 0.85
    assert (out / "adapter_model.safetensors").exists() and (out / "loss.png").exists()

    from tunesmith.data.template import encode_prompt
    from tunesmith.models.loader import inference_model_args, load_for_inference

    model, tokenizer = load_for_inference(inference_model_args(str(out)))
    ids = torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": "What is your name?"}])])
    reply = model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:]
    assert len(reply) > 0
