"""`tunesmith plan`: the memory of a step on fake tensors against the same step on real CPU tensors (counted by torch's
MemTracker), the weights, adapter and optimizer state against their arithmetic, the longest conversation that fits,
and the command's lines and refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from tunesmith.plan import fake_device
from tunesmith.plan.command import PlannedModel, longest_fitting, parse_plan
from tunesmith.plan.report import weights_of
from tunesmith.recipes.plan import main

BLOCK = fake_device.ALLOCATOR_BLOCK
ROOT = Path(__file__).resolve().parents[1]


def config_dir(tmp_path, **overrides) -> str:
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, tie_word_embeddings=False,
                 bos_token_id=1, eos_token_id=2, pad_token_id=2)
    LlamaConfig(**{**shape, **overrides}).save_pretrained(tmp_path)  # config.json alone: no weights
    return str(tmp_path)


def planned(model_dir: str, *flags: str) -> PlannedModel:
    return PlannedModel(*parse_plan(["--model_name_or_path", model_dir, "--packing", "true", *flags]))


def blocks(nbytes: float) -> int:
    return math.ceil(nbytes / BLOCK) * BLOCK


def test_qlora_weights_adapter_gradients_and_optimizer_state_are_their_arithmetic(tmp_path):
    plan = planned(config_dir(tmp_path), "--quantization_bit", "4", "--lora_r", "8")
    weights = weights_of(plan.model)
    linears = [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128)] * 2  # (out, in) per layer
    # bitsandbytes NF4 with nested constants: 2 values a byte, absmax as 8-bit per 64 values, its own absmax in
    # float32 per 256 of those, the two code maps (16 and 256 float32) and the float32 offset
    per_weight = [blocks(o * i / 2) + blocks(o * i / 64) + blocks(math.ceil(o * i / 64 / 256) * 4) + blocks(16 * 4)
                  + blocks(256 * 4) + blocks(4) for o, i in linears]
    assert weights.four_bit == sum(per_weight)
    lora = [blocks(8 * i * 4) + blocks(o * 8 * 4) for o, i in linears]  # A [r, in] and B [out, r], float32
    assert weights.adapter == sum(lora)
    assert weights.frozen_16bit == 2 * blocks(512 * 64 * 2) + 5 * blocks(64 * 2)  # embeddings, head, 5 norms in bf16
    step = plan.step(256)
    assert step.gradients == weights.adapter
    # AdamW: two moments per trained tensor, and its step count (a float32 scalar each under the fused optimizer)
    assert step.optimizer_state == 2 * weights.adapter + len(lora) * 2 * blocks(4)


def real_step_peak(model_dir: str, plan: PlannedModel, tokens: int, conversations: int) -> int:
    """The steady step's peak of the same run on real CPU tensors, by torch's MemTracker: a first step (which checks
    the model's masks once and makes the optimizer's state), then a second one measured."""
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    from tunesmith.models.attention import use_varlen_attention
    from tunesmith.plan.step import make_optimizer, planned_row

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig.from_pretrained(model_dir), dtype=torch.float32)
    use_varlen_attention(model)
    model.train()
    optimizer = make_optimizer(model, plan.args.training)
    row = planned_row(tokens, conversations, plan.args.plan.trained_share)
    num_items = int((row["labels"] != -100).sum())

    def step() -> None:
        loss = model(**row, num_items_in_batch=num_items).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.args.training.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("conversations", [1, 3])
def test_the_planned_step_peaks_where_the_same_step_on_real_cpu_tensors_does(tmp_path, monkeypatch, conversations):
    # head_dim 12 is no flash kernel's (a multiple of 8): the packed row runs SDPA per example on a GPU as on this CPU,
    # so fake and real run the very same code; full fine-tuning in float32 lets MemTracker hook every weight.
    model_dir = config_dir(tmp_path, hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=12)
    monkeypatch.setattr(fake_device, "ALLOCATOR_BLOCK", 1)  # MemTracker rounds CUDA storages only
    monkeypatch.setattr("tunesmith.plan.step.ALLOCATOR_BLOCK", 1)
    plan = planned(model_dir, "--finetuning_type", "full", "--dtype", "float32", "--bf16", "false",
                   "--gradient_checkpointing", "false")
    planned_peak = plan.step(3000, conversations).peak
    # within the row's own tensors (ids, labels, positions: 24 bytes a token), which the plan puts on the device and
    # the real run made before MemTracker started
    assert planned_peak == pytest.approx(real_step_peak(model_dir, plan, 3000, conversations), abs=24 * 3000 + 1024)


def test_offloaded_checkpointing_keeps_each_layers_input_in_host_memory(tmp_path):
    plan = planned(config_dir(tmp_path), "--quantization_bit", "4", "--gradient_checkpointing", "offload")
    on_device = planned(config_dir(tmp_path / "again"), "--quantization_bit", "4", "--gradient_checkpointing", "true")
    offloaded, kept = plan.step(1000), on_device.step(1000)
    layers, hidden, bf16 = 2, 64, 2
    assert offloaded.kept["host"] == layers * 1000 * hidden * bf16  # each layer's input, pinned on the host
    assert kept.kept["host"] == 0
    # every layer input leaves the device but the first: the embeddings' output, made a leaf that requires grad
    # (enable_input_require_grads), which autograd's gradient accumulator holds on to
    assert kept.kept["device"] - offloaded.kept["device"] == (layers - 1) * blocks(1000 * hidden * bf16)
    # and the backward copies each back to the device while its layer recomputes
    assert offloaded.layers_backward_peak >= kept.layers_backward_peak + blocks(1000 * hidden * bf16)


def test_the_longest_conversation_grows_with_memory_and_the_next_token_does_not_fit(tmp_path):
    plan = planned(config_dir(tmp_path), "--quantization_bit", "4")
    base = plan.step(16).peak
    found = []
    for extra_mb in (2, 4):
        budget = base + extra_mb * 2**20
        fits, fails = longest_fitting(plan.step, budget, up_to=1 << 16, start=64)
        assert fits.peak <= budget < fails.peak and fails.tokens == fits.tokens + 1
        found.append(fits.tokens)
    assert found[0] < found[1]


def test_the_command_prints_its_lines_and_refuses_a_folder_without_config_json(tmp_path, capsys):
    main(["--model_name_or_path", config_dir(tmp_path / "model"), "--packing", "true", "--quantization_bit", "4",
          "--plan_tokens", "128", "256", "--memory_gb", "0.05"])
    out = capsys.readouterr().out
    for key in ("weights_4bit_mb:", "adapter_mb:", "tokens: 128", "tokens: 256", "  peak_device_mb:",
                "  kept_device_kb_per_token:", "  layer_backward_peak_mb:", "longest_tokens:"):
        assert key in out, key
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as stop:
        main(["--model_name_or_path", str(tmp_path / "empty"), "--packing", "true"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "no config.json in it" in err and str(tmp_path / "empty") in err
    with pytest.raises(SystemExit):
        main(["--model_name_or_path", config_dir(tmp_path / "model2")])
    assert "tunesmith plan plans packed rows: add --packing true" in capsys.readouterr().err


def test_8bit_weights_are_int8_rows_and_a_float32_scale_a_row(tmp_path):
    plan = planned(config_dir(tmp_path), "--quantization_bit", "8")
    linears = [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128)] * 2
    weights = weights_of(plan.model)
    assert weights.eight_bit == sum(blocks(o * i) + blocks(o * 4) for o, i in linears)
    assert weights.four_bit == 0
    assert plan.step(256).peak > weights.eight_bit


def test_sequence_parallel_plans_one_ranks_share_of_the_row(tmp_path, capsys):
    """--sequence_parallel_size N: each row's lines are one rank's, whose step is the one-rank plan of ceil(T/N)
    tokens (Ulysses' attention holds all the tokens for 1/N of the heads: the same bytes); the longest conversation is
    N ranks' worth; heads N does not divide and ZeRO-3 (whose sharded weights the plan does not count) are refused."""
    model_dir = config_dir(tmp_path / "model")
    flags = ["--model_name_or_path", model_dir, "--packing", "true", "--quantization_bit", "4"]
    sharded = ["--deepspeed", str(ROOT / "configs/ds_zero2.json"), "--sequence_parallel_size", "2"]
    one_rank = planned(model_dir, "--quantization_bit", "4")
    two_ranks = PlannedModel(*parse_plan([*flags, *sharded]))
    assert two_ranks.step(3001).peak == one_rank.step(1501).peak and two_ranks.step(3001).tokens == 1501
    memory = one_rank.step(16).peak + 2 * 2**20
    longest_one, _ = longest_fitting(one_rank.step, memory, up_to=1 << 16, start=64)
    main([*flags, *sharded, "--plan_tokens", "3001", "--memory_gb", str(memory / 2**30), "--longest_up_to", "65536"])
    out = capsys.readouterr().out
    assert "tokens: 3001\n  conversations: 1\n  sequence_parallel_ranks: 2\n  tokens_per_rank: 1501\n" in out
    assert f"  peak_device_mb: {one_rank.step(1501).peak / 2**20:.1f}\n" in out
    longest = int(out.split("longest_tokens: ")[1].split()[0])
    assert longest in (2 * longest_one.tokens - 1, 2 * longest_one.tokens)  # ceil(T / 2) tokens on each rank
    for extra, message in ((["--sequence_parallel_size", "3"], "each rank attends with 1/3 of them"),
                           (["--sequence_parallel_size", "2", "--deepspeed", str(ROOT / "configs/ds_zero3.json")],
                            "under ZeRO-3 shards the weights")):
        deepspeed = [] if "--deepspeed" in extra else ["--deepspeed", str(ROOT / "configs/ds_zero2.json")]
        with pytest.raises(SystemExit) as stop:
            main([*flags, *deepspeed, *extra])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and err.strip().count("\n") == 0, err
    # refused before transformers' arguments exist: a ZeRO-3 config there would switch ZeRO-3 loading on for the
    # process (is_deepspeed_zero3_enabled), and every later from_pretrained in it would start DeepSpeed
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    assert not is_deepspeed_zero3_enabled()
