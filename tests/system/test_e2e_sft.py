"""End to end on the real SmolLM2-135M-Instruct: LoRA SFT on demo conversations lowers the loss on
them and leaves an adapter that loads back and generates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tunesmith.sft.command import run as sft_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.heavy  # the real 135M model trains (~4 min loaded; scripts/test_floors.sh runs it on the floors); -m heavy
def test_lora_sft_on_real_model_lowers_loss(tmp_path, default_model_path):
    data = tmp_path / "demo24.jsonl"
    data.write_text("".join((ROOT / "data/demo/sft.jsonl").read_text().splitlines(keepends=True)[:24]))
    out = tmp_path / "sft"
    trainer = sft_main([
        "--data_path", str(data), "--eval_data_path", str(data), "--output_dir", str(out),
        "--max_steps", "6", "--per_device_train_batch_size", "4", "--learning_rate", "1e-3",
        "--max_seq_length", "192", "--save_strategy", "no", "--seed", "0",
    ])
    # The same conversations, scored by the base (adapter off) and by the trained adapter.
    after = trainer.evaluate()["eval_loss"]
    with trainer.model.disable_adapter():
        before = trainer.evaluate()["eval_loss"]
    assert after < 0.9 * before, (before, after)
    assert (out / "adapter_model.safetensors").exists() and (out / "loss.png").exists()

    from tunesmith.data.template import encode_prompt
    from tunesmith.models.loader import inference_model_args, load_for_inference

    model, tokenizer = load_for_inference(inference_model_args(str(out)))
    ids = torch.tensor([encode_prompt(tokenizer, [{"role": "user", "content": "What is your name?"}])])
    reply = model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:]
    assert len(reply) > 0
