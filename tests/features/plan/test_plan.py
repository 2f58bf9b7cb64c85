"""`tunesmith plan`: the memory of a step on fake tensors against the same step on real CPU tensors (counted by torch's
MemTracker), the weights, adapter and optimizer state against their arithmetic, the longest conversation that fits,
and the command's lines and refusals."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from tunesmith.plan import fake_device
from tunesmith.plan.command import PlannedModel, longest_fitting, main, parse_plan
from tunesmith.plan.report import weights_of

BLOCK = fake_device.ALLOCATOR_BLOCK
ROOT = Path(__file__).resolve().parents[3]


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


@pytest.mark.parametrize("tokens", [10_000, 1_000])
def test_offloaded_checkpointing_keeps_each_layers_input_in_host_memory(tmp_path, tokens):
    """Each layer's input (of at least train/layer_input_offload.MIN_OFFLOADED_BYTES: a smaller copy costs more than
    it frees, and stays on the device) is planned in pinned host memory, and back on the device in backward."""
    from tunesmith.train.layer_input_offload import MIN_OFFLOADED_BYTES

    plan = planned(config_dir(tmp_path), "--quantization_bit", "4", "--gradient_checkpointing", "offload")
    on_device = planned(config_dir(tmp_path / "again"), "--quantization_bit", "4", "--gradient_checkpointing", "true")
    offloaded, kept = plan.step(tokens), on_device.step(tokens)
    layers, hidden, bf16 = 2, 64, 2
    layer_input = tokens * hidden * bf16
    if layer_input < MIN_OFFLOADED_BYTES:
        assert offloaded.kept == kept.kept and offloaded.peak == kept.peak
        return
    assert offloaded.kept["host"] == layers * layer_input  # each layer's input, pinned on the host
    assert kept.kept["host"] == 0
    # every layer input leaves the device but the first: the embeddings' output, made a leaf that requires grad
    # (enable_input_require_grads), which autograd's gradient accumulator holds on to
    assert kept.kept["device"] - offloaded.kept["device"] == (layers - 1) * blocks(layer_input)
    # and the backward copies each back to the device while its layer recomputes
    assert offloaded.layers_backward_peak >= kept.layers_backward_peak + blocks(layer_input)


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


def test_no_model_given_plans_the_default_model(tmp_path, capsys, monkeypatch):
    """As every command does, the plan takes the embedded default model when --model_name_or_path is left out (its
    folder stood in for here by a small config: converting the real one is the slow tier's)."""
    from tunesmith.models import loader

    monkeypatch.setattr(loader, "ensure_default_model", lambda: Path(config_dir(tmp_path / "default")))
    main(["--packing", "true", "--plan_tokens", "128"])
    assert f"model: {tmp_path / 'default'} (llama," in capsys.readouterr().out


def test_8bit_weights_are_int8_rows_and_a_float32_scale_a_row(tmp_path):
    plan = planned(config_dir(tmp_path), "--quantization_bit", "8")
    linears = [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128)] * 2
    weights = weights_of(plan.model)
    assert weights.eight_bit == sum(blocks(o * i) + blocks(o * 4) for o, i in linears)
    assert weights.four_bit == 0
    assert plan.step(256).peak > weights.eight_bit


@pytest.mark.heavy  # ~1.5 min loaded; -m heavy
def test_sequence_parallel_plans_one_ranks_share_of_the_row(tmp_path, capsys):
    """--sequence_parallel_size N: each row's lines are one rank's, whose step is the one-rank plan of ceil(T/N)
    tokens (Ulysses' attention holds all the tokens for 1/N of the heads: the same bytes); the longest conversation is
    N ranks' worth; heads N does not divide are refused."""
    model_dir = config_dir(tmp_path / "model")
    flags = ["--model_name_or_path", model_dir, "--packing", "true", "--quantization_bit", "4",
             "--gradient_checkpointing", "true"]
    sharded = ["--deepspeed", str(ROOT / "configs/ds_zero2.json"), "--sequence_parallel_size", "2"]
    one_rank = planned(model_dir, "--quantization_bit", "4", "--gradient_checkpointing", "true")
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
    with pytest.raises(SystemExit) as stop:
        main([*flags, "--deepspeed", str(ROOT / "configs/ds_zero2.json"), "--sequence_parallel_size", "3"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "each rank attends with 1/3 of them" in err and err.strip().count("\n") == 0


def test_auto_chooses_layer_modes_by_the_forward_budget_and_the_metered_step_agrees_with_its_estimate(tmp_path):
    """--gradient_checkpointing auto (SFT's GPU default for packed rows): the forward budget probes the fake model as
    it probes the real one, chooses by layer_modes.choose_modes, and the step run with those modes set peaks where the
    budget estimated: to within 2% with every layer recomputed; over it by what the estimate counts twice with layers
    kept (layer_modes' docstring: a kept layer's activations beside the recomputation's working set); under it by two
    layer inputs a token with layers offloaded (the first layer's input, which autograd holds, and the input copied
    back while its layer recomputes)."""
    from tunesmith.train.layer_modes import choose_modes

    model_dir = config_dir(tmp_path, num_hidden_layers=4, max_position_embeddings=16384)
    plan = PlannedModel(*parse_plan(["--model_name_or_path", model_dir, "--packing", "true", "--quantization_bit",
                                     "4"]), memory=int(0.03 * 2**30))
    budget, layers, hidden_bf16 = plan.auto.budget, 4, 64 * 2
    assert budget.rates.offload_saving == hidden_bf16  # a layer's input, a token
    assert budget.rates.recomputed > 0 and budget.rates.kept_extra > 0
    seen = set()
    for tokens in (512, 3000, 4096, 8192):
        step, choice = plan.planned_step(tokens)
        modes = choice.modes
        assert modes == choose_modes(tokens, budget.available, budget.rates, layers)
        assert [layer.gradient_checkpointing for layer in plan.auto.layers].count(False) == modes.kept  # as run
        seen.add((modes.kept == layers, 0 < modes.kept < layers, modes.recomputed == layers, modes.offloaded > 0))
        predicted, metered = choice.predicted_peak, step.peak
        if modes.offloaded:
            assert 0 <= metered - predicted <= 2 * hidden_bf16 * tokens + 4096
        elif modes.kept:
            assert 0 <= predicted - metered <= modes.kept * budget.rates.kept_extra * tokens
        else:
            assert metered == pytest.approx(predicted, rel=0.02)
    assert len(seen) == 4  # every layer kept, some kept, every one recomputed, offloaded
    # a row of 4 conversations that does not fit keeping every layer: under the plan's timing assumption (a forward's
    # fixed seconds 0) the budget splits it into forwards of whole conversations that keep every layer
    step, choice = plan.planned_step(4096, 4)
    assert choice.forwards == [0, 1024, 2048, 3072, 4096] and choice.modes.kept == layers
    assert "forwards 4 of at most 1024 tokens (chosen by the assumed timings: a forward's fixed seconds 0)" \
        in choice.line(step.peak, plan.auto.memory)
    assert 0 <= choice.predicted_peak - step.peak <= layers * budget.rates.kept_extra * 1024
    assert step.peak < plan.planned_step(4096)[0].peak  # the same tokens in one forward, layers recomputed


def test_auto_finds_the_longest_conversation_where_even_offloading_every_layer_no_longer_fits(tmp_path, capsys):
    model_dir = config_dir(tmp_path, num_hidden_layers=3, max_position_embeddings=16384)
    flags = ["--model_name_or_path", model_dir, "--packing", "true", "--quantization_bit", "4", "--memory_gb", "0.01",
             "--longest_up_to", "16384"]
    main([*flags, "--plan_tokens", "256"])
    out = capsys.readouterr().out
    assert "checkpointing auto, chosen per row by the forward budget" in out and "\nauto: probed as the run" in out
    assert "  auto: forwards 1 of at most 256 tokens; layers kept 3, recomputed 0, offloaded 0; " \
           "predicted_peak_device_mb " in out
    longest = int(out.split("longest_tokens: ")[1].split()[0])
    assert f"longest_next_tokens: {longest + 1}\n" in out
    # where every layer is offloaded, as --gradient_checkpointing offload does all along (searched from the answer)
    offloaded = PlannedModel(*parse_plan([*flags, "--gradient_checkpointing", "offload"]))
    fits, fails = longest_fitting(offloaded.step, int(0.01 * 2**30), up_to=16384, start=longest)
    assert fits.tokens == longest > 256 and fails.tokens == longest + 1


def zero3_config(tmp_path, **zero) -> str:
    path = tmp_path / "ds_zero3.json"
    path.write_text(json.dumps({"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, **zero}}))
    return str(path)


def zero3_plans(tmp_path, monkeypatch, *worlds: int) -> dict[int, PlannedModel]:
    """Full fine-tuning of the test shape under ZeRO-3 without persistent parameters, one plan per world size, counted
    in bytes (no allocator blocks: DeepSpeed's shards are views of flat buffers)."""
    monkeypatch.setattr(fake_device, "ALLOCATOR_BLOCK", 1)
    monkeypatch.setattr("tunesmith.plan.step.ALLOCATOR_BLOCK", 1)
    model_dir = config_dir(tmp_path / "model")
    config = zero3_config(tmp_path, stage3_param_persistence_threshold=0, reduce_bucket_size="auto",
                          stage3_prefetch_bucket_size="auto")
    full = ["--finetuning_type", "full", "--gradient_checkpointing", "true", "--deepspeed", config]
    return {world: planned(model_dir, *full, "--world_size", str(world)) for world in worlds}


def test_zero3_shards_the_model_states_over_the_world_size_with_deepspeeds_buckets(tmp_path, monkeypatch):
    """A rank holds 1/N of every weight in bf16 and of 14 bytes a trained parameter (gradient shard in bf16, fp32
    master copy and Adam moments), 4 more at the optimizer step (the gradient shard's fp32 copy); the buckets are
    DeepSpeed 0.19.8's defaults where the config leaves them out, transformers' hidden-size values where it says auto;
    the activations are one rank's whatever N."""
    from tunesmith.plan.zero3 import DEEPSPEED_DEFAULTS, Zero3Settings

    plans = zero3_plans(tmp_path, monkeypatch, 1, 2)
    params = sum(p.numel() for p in plans[2].model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in plans[2].model.modules())
    rank = plans[2].zero3_rank
    assert (rank.sharded_weights, rank.gradient_shards, rank.optimizer_state, rank.step_gradients) == \
        (params, params, 6 * params, 2 * params)  # 2, 2, 12 and 4 bytes a parameter over 2 ranks
    assert rank.persistent_weights == 0 and rank.gathered == 2 * largest + int(0.9 * 64 * 64) * 2
    assert rank.reduce_bucket == 2 * 64 * 64
    script = ("from deepspeed.runtime.zero.config import DeepSpeedZeroConfig as C; c = C(); "
              "print([c.reduce_bucket_size, c.prefetch_bucket_size, c.param_persistence_threshold, "
              "c.max_live_parameters])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert list(DEEPSPEED_DEFAULTS.values()) == json.loads(out.strip().splitlines()[-1])
    assert Zero3Settings.read(str(ROOT / "configs/ds_zero3.json"), 64, 2).persistence_threshold == 640  # auto
    defaults = Zero3Settings.read(zero3_config(tmp_path), 64, 2)
    assert (defaults.reduce_bucket, defaults.prefetch_bucket) == (int(5e8), int(5e7))
    steps = {world: plan.step(1024) for world, plan in plans.items()}
    held = {world: plan.zero3_rank.held for world, plan in plans.items()}
    assert steps[1].peak - steps[2].peak == held[1] - held[2] > 0  # the same activations on every rank
    assert steps[2].gradients_held == steps[2].gradients == rank.gradient_shards


ZERO3_TWO_RANKS = """
import json, os
import deepspeed, torch
from transformers import LlamaConfig, LlamaForCausalLM

deepspeed.init_distributed(dist_backend="gloo")
model = LlamaForCausalLM(LlamaConfig.from_pretrained(os.environ["MODEL_DIR"]))
config = json.load(open(os.environ["DS_CONFIG"]))
config.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, bf16={"enabled": True})
config["zero_optimization"].update(reduce_bucket_size=64 * 64, stage3_prefetch_bucket_size=int(0.9 * 64 * 64))
engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                               config=config)
ids = torch.randint(0, 512, (1, 64))
engine.backward(engine(input_ids=ids, labels=ids).loss)
engine.step()
size = lambda t: t.numel() * t.element_size()
# a file each: two processes printing to one pipe can interleave their lines
open(f"rank{os.environ['RANK']}.json", "w").write(json.dumps({
    "shards": sum(size(p.ds_tensor) for p in engine.module.parameters()),
    "gradient_shards": size(optimizer.grad_partitions_flat_buffer),
    "optimizer_state": sum(size(t) for t in optimizer.fp32_partitioned_groups_flat)
    + sum(size(v) for s in optimizer.optimizer.state.values() for v in s.values() if v.numel() > 1),
    "reduce_bucket": sum(size(b.buffer) for b in optimizer.ipg_buckets.values() if b.buffer is not None)}))
"""


def test_zero3_rank_states_are_what_deepspeed_allocates_on_two_cpu_ranks(tmp_path, monkeypatch):
    """The plan's rank bytes against DeepSpeed 0.19.8's own buffers after a step on two CPU ranks (gloo, torchrun in
    a subprocess): the bf16 weight shards, the gradient partitions, the fp32 master partition and Adam's moments, and
    the reduce bucket (about 20 s on 2 cores)."""
    import os

    plan = zero3_plans(tmp_path, monkeypatch, 2)[2]
    script = tmp_path / "zero3_two_ranks.py"
    script.write_text(ZERO3_TWO_RANKS)
    with socket.socket() as s:  # a free port: other test processes may run torchrun beside this one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MODEL_DIR": str(tmp_path / "model"), "DS_CONFIG": plan.args.training.deepspeed,
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(port), str(script)], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    rank = plan.zero3_rank
    assert ranks[0] == ranks[1]
    assert ranks[0] == {"shards": rank.sharded_weights, "gradient_shards": rank.gradient_shards,
                        "optimizer_state": rank.optimizer_state, "reduce_bucket": rank.reduce_bucket}


def test_zero3_with_sequence_parallelism_plans_one_rank_and_leaves_zero3_loading_off(tmp_path, capsys):
    model_dir = config_dir(tmp_path / "model")
    flags = ["--model_name_or_path", model_dir, "--packing", "true", "--quantization_bit", "4",
             "--deepspeed", str(ROOT / "configs/ds_zero3.json")]
    main([*flags, "--sequence_parallel_size", "2", "--world_size", "4", "--plan_tokens", "2000"])
    out = capsys.readouterr().out
    assert "zero3_world_size: 4\n" in out and "tokens_per_rank: 1000\n" in out
    assert "checkpointing on" in out  # QLoRA's GPU default under DeepSpeed, whose forwards no budget sizes
    # transformers' arguments with a ZeRO-3 config switch ZeRO-3 loading on for the process
    # (is_deepspeed_zero3_enabled): every later from_pretrained in it would start DeepSpeed
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    assert not is_deepspeed_zero3_enabled()
    for extra, message in ((["--world_size", "3", "--sequence_parallel_size", "2"], "not a multiple of it"),
                           (["--bf16", "false"], "leave out --bf16 false")):
        with pytest.raises(SystemExit) as stop:
            main([*flags, *extra])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and err.strip().count("\n") == 0, err
    with pytest.raises(SystemExit):
        main(["--model_name_or_path", model_dir, "--packing", "true", "--world_size", "2"])
    assert "under ZeRO-3 only; add --deepspeed configs/ds_zero3.json" in capsys.readouterr().err


def test_auto_probes_a_large_vocabulary_on_the_tiled_head_and_flags_a_choice_over_the_memory(tmp_path, capsys):
    """A large vocabulary on a small model, half the tokens trained: the probe's 1,024-token forward would take the
    logits' path (512 x 100,000 logits, under the tiled head's 2^26) and its 2,048-token one the tiles, which peak no
    higher, and the slope read 0 (the run's budget then divided by it). The probe now runs both on the tiles, as the
    long forwards it stands for: the rate is positive, and the planned row's metered peak is within the estimate."""
    from tunesmith.plan.auto import AutoChoice
    from tunesmith.train.layer_modes import LayerModes

    main(["--model_name_or_path", config_dir(tmp_path, vocab_size=100_000), "--packing", "true", "--quantization_bit",
          "4", "--memory_gb", "1", "--plan_tokens", "4096", "--longest_up_to", "4096"])
    out = capsys.readouterr().out
    assert "checkpointing auto, chosen per row by the forward budget" in out and "  auto: " in out
    assert "the run's estimate is low here" not in out
    choice = AutoChoice([0, 4096], LayerModes(1, 1, 0), predicted_peak=900)
    assert choice.line(metered_peak=1100, memory=1000).endswith(
        "predicted_peak_device_mb 0.0; the metered peak is over the memory: the run's estimate is low here")
    assert choice.line(metered_peak=990, memory=1000).endswith("predicted_peak_device_mb 0.0")
