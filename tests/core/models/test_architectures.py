"""Exact on every architecture we list: tiny random models built from transformers' own config classes
(tests/helpers/arch_models.py: windows of 16 tokens, shorter than every conversation here; one sliding and one full layer
where the architecture mixes them). For each:

- the first step's loss of a packed run (several conversations in one row) equals the padded run's and an eager
  reference computed here, each conversation alone through transformers' eager attention (float32, 1e-5 relative);
- the engine's greedy replies equal transformers' `generate()` with eager attention, on prompts longer than the
  window, batched together;
- the merged model's logits equal base + adapter;
- the packed kernel refuses an attention argument it does not implement, and a model mask it does not reproduce.

An architecture the installed transformers lacks is skipped with the reason."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers.arch_models import ARCHITECTURES, WINDOW, build_architecture

TOPICS = ["the tides", "a sourdough starter", "binary search", "the French revolution", "photosynthesis",
          "a bicycle's gears", "compound interest", "the water cycle"]


def conversation(i: int) -> list[dict]:
    """Conversations of uneven lengths (about 40-140 tokens), all longer than WINDOW, some with two turns."""
    topic = TOPICS[i]
    reply = f"Here is a short note on {topic}. " + "It is simpler than it sounds, step by step. " * (i % 4 + 1)
    turns = [{"role": "user", "content": f"Explain {topic} to me in plain words."},
             {"role": "assistant", "content": reply}]
    if i % 2:
        turns += [{"role": "user", "content": "And why does it matter?"},
                  {"role": "assistant", "content": f"Because {topic} shows up in daily life more than you think."}]
    return turns


@pytest.fixture(scope="module")
def arch_data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("arch_data") / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": conversation(i)}) + "\n" for i in range(len(TOPICS))))
    return str(path)


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch_dir(request, tmp_path_factory, tokenizer) -> str:
    from transformers import CONFIG_MAPPING

    if request.param not in CONFIG_MAPPING:
        pytest.skip(f"transformers has no {request.param} config class")
    return build_architecture(tmp_path_factory.mktemp(request.param), request.param, tokenizer)


def sft_first_step(model_dir: str, data: str, out, *extra: str):
    """One LoRA step (float32, no dropout, the 8 conversations in one batch): the trainer, with its logged loss."""
    from tunesmith.sft.command import run

    return run(["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
                "--max_steps", "1", "--per_device_train_batch_size", "8", "--learning_rate", "5e-2",
                "--bf16", "false", "--lora_dropout", "0", "--disable_dropout", "--logging_steps", "1",
                "--save_strategy", "no", "--plot_loss", "false", "--seed", "0", "--router_aux_loss_coef", "0",
                *extra])


def eager_reference_loss(model_dir: str, rows) -> float:
    """The mean loss over every trained token, each conversation alone through transformers' eager attention."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids, labels = torch.tensor([row["input_ids"]]), torch.tensor(row["labels"])
            logits = model(input_ids=ids).logits[0, :-1].double()
            trained = labels[1:] != -100
            total += torch.nn.functional.cross_entropy(logits[trained], labels[1:][trained], reduction="sum").item()
            count += int(trained.sum())
    return total / count


@pytest.fixture(scope="module")
def packed_run(arch_dir, arch_data, tmp_path_factory):
    return sft_first_step(arch_dir, arch_data, tmp_path_factory.mktemp("packed"), "--packing", "true")


def first_loss(trainer) -> float:
    return next(record["loss"] for record in trainer.state.log_history if "loss" in record)


def test_packed_and_padded_first_loss_equal_eager_on_each_conversation_alone(arch_dir, arch_data, packed_run,
                                                                             tmp_path):
    rows = list(packed_run.train_dataset)
    assert packed_run.model.get_base_model().config._attn_implementation.endswith("_varlen")
    assert len(rows) == 8 and min(len(r["input_ids"]) for r in rows) > WINDOW
    padded = sft_first_step(arch_dir, arch_data, tmp_path / "padded", "--packing", "false")
    reference = eager_reference_loss(arch_dir, rows)
    assert first_loss(packed_run) == pytest.approx(reference, rel=1e-5)
    assert first_loss(padded) == pytest.approx(reference, rel=1e-5)


def test_engine_greedy_replies_equal_eager_generate(arch_dir, tokenizer):
    from transformers import AutoModelForCausalLM, GenerationConfig

    from tunesmith.data.template import encode_prompt
    from tunesmith.generation import Engine, SamplingParams
    from tunesmith.models.loader import inference_model_args, load_for_inference

    model, _ = load_for_inference(inference_model_args(arch_dir))  # --attn_implementation auto
    prompts = [encode_prompt(tokenizer, conversation(i)[:1]) for i in (0, 3, 6)]
    assert min(map(len, prompts)) > WINDOW
    ours = [c[0].token_ids for c in Engine(model, tokenizer).generate(prompts, SamplingParams(temperature=0,
                                                                                           max_new_tokens=12))]
    eager = AutoModelForCausalLM.from_pretrained(arch_dir, attn_implementation="eager", dtype=torch.float32).eval()
    config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=[tokenizer.eos_token_id],
                              pad_token_id=tokenizer.pad_token_id)
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            row = eager.generate(torch.tensor([prompt]), generation_config=config)[0, len(prompt):].tolist()
            expected.append(row[:row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row)
    assert ours == expected
    assert sum(map(len, ours)) + min(map(len, prompts)) > WINDOW  # replies that attend past the window


def test_merged_logits_equal_base_plus_adapter(arch_dir, packed_run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tunesmith.merge.command import run as merge

    adapter = packed_run.args.output_dir
    result = merge(["--adapter_name_or_path", adapter, "--output_dir", str(tmp_path / "merged")])
    ids = torch.tensor([list(range(200, 260))])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(arch_dir, attn_implementation="eager", dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, adapter).eval()(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), attn_implementation="eager",
                                                      dtype=torch.float32).eval()(input_ids=ids).logits
        unadapted = AutoModelForCausalLM.from_pretrained(arch_dir, attn_implementation="eager",
                                                         dtype=torch.float32).eval()(input_ids=ids).logits
    assert (adapted - unadapted).abs().max() > 1e-3  # the adapter trained something
    assert torch.allclose(merged, adapted, rtol=1e-4, atol=1e-4 * float(adapted.abs().max()))
    assert math.isfinite(result.max_abs_diff)


def packed_row(lengths: list[int], heads: int = 4, kv_heads: int = 2, dim: int = 16):
    torch.manual_seed(0)
    total = sum(lengths)
    q, k, v = (torch.randn(1, h, total, dim) for h in (heads, kv_heads, kv_heads))
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, bounds


class Attention(torch.nn.Module):
    num_key_value_groups, head_dim, is_causal = 2, 16, True


def test_packed_kernel_refuses_an_argument_it_does_not_implement():
    from tunesmith.errors import ConfigError
    from tunesmith.models.attention import sdpa_varlen_attention_forward

    q, k, v, bounds = packed_row([20, 30])
    out, _ = sdpa_varlen_attention_forward(Attention(), q, k, v, None, cu_seq_lens_q=bounds, max_length_q=30,
                                           position_ids=torch.zeros(1, 50, dtype=torch.long), shift_labels=None)
    assert out.shape == (1, 50, 4, 16)
    with pytest.raises(ConfigError, match=r"passes attention_chunk_size to its attention function.*--packing false"):
        sdpa_varlen_attention_forward(Attention(), q, k, v, None, cu_seq_lens_q=bounds, max_length_q=30,
                                      attention_chunk_size=8)
    with pytest.raises(ConfigError, match=r"is_causal=False"):
        sdpa_varlen_attention_forward(Attention(), q, k, v, None, cu_seq_lens_q=bounds, max_length_q=30,
                                      is_causal=False)


def test_packed_kernel_refuses_a_model_mask_it_does_not_reproduce():
    """A model that keeps a window in its mask only (and does not pass sliding_window) is refused at its first packed
    row; the same mask with the window passed is what the kernel applies."""
    from tunesmith.errors import ConfigError
    from tunesmith.models.attention import example_mask, sdpa_varlen_attention_forward

    layer = Attention()
    short_q, short_k, short_v, short_bounds = packed_row([6, 8])  # no longer than the window: it shows nowhere
    short_mask = torch.zeros(14, 14, dtype=torch.bool)
    short_mask[:6, :6], short_mask[6:, 6:] = example_mask(6, 8, short_q.device), example_mask(8, 8, short_q.device)
    sdpa_varlen_attention_forward(layer, short_q, short_k, short_v, short_mask[None, None], cu_seq_lens_q=short_bounds,
                                  max_length_q=8)
    q, k, v, bounds = packed_row([20, 30])  # the same layer's first longer examples are checked again
    mask = torch.zeros(50, 50, dtype=torch.bool)
    mask[:20, :20], mask[20:, 20:] = example_mask(20, 8, q.device), example_mask(30, 8, q.device)
    with pytest.raises(ConfigError, match="own mask differs from causal attention inside an example"):
        sdpa_varlen_attention_forward(layer, q, k, v, mask[None, None], cu_seq_lens_q=bounds, max_length_q=30)
    windowed, _ = sdpa_varlen_attention_forward(Attention(), q, k, v, mask[None, None], cu_seq_lens_q=bounds,
                                                max_length_q=30, sliding_window=8)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    expected = sdpa_attention_forward(Attention(), q, k, v, mask[None, None], is_causal=False)[0]
    torch.testing.assert_close(windowed, expected)


def test_auto_attention_takes_what_the_model_supports(tokenizer):
    from tests.helpers.arch_models import architecture_config
    from tunesmith.errors import ConfigError
    from tunesmith.models.attention import choose_attn_implementation

    gemma2, llama = architecture_config("gemma2", tokenizer), architecture_config("llama", tokenizer)
    assert choose_attn_implementation("auto", gemma2) == "eager"
    assert choose_attn_implementation("auto", llama) == "sdpa"
    assert choose_attn_implementation("auto", llama, flash_installed=True) == "flash_attention_2"
    assert choose_attn_implementation("auto", gemma2, task="reward") == "eager"
    # flash-attn 2 has no attention sinks: transformers would drop gpt-oss's
    assert choose_attn_implementation("auto", architecture_config("gpt_oss", tokenizer), flash_installed=True) == "eager"
    with pytest.raises(ConfigError, match=r"^--attn_implementation sdpa: gemma2 models do not support it; use eager"):
        choose_attn_implementation("sdpa", gemma2)


@pytest.mark.parametrize("name", ["mistral", "gemma2", "gpt_oss", "gemma3_text", "qwen2_moe"])
def test_packed_logits_equal_eager_per_example_forward_only(name, tokenizer, monkeypatch):
    """The kernel alone, as the gpu twin (tests/system/test_gpu.py) runs it on CUDA in bf16: here CPU, float32. Qwen2-MoE
    keeps its window on the attention module and in its mask only (it does not pass it to the kernel)."""
    from tests.helpers import arch_models
    from tests.helpers.arch_models import packed_vs_eager

    monkeypatch.setitem(arch_models.ARCHITECTURES, "qwen2_moe", {
        "sliding_window": WINDOW, "use_sliding_window": True, "max_window_layers": 1, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32})

    difference, largest, implementation = packed_vs_eager(name, tokenizer, "cpu", torch.float32)
    assert implementation.endswith("_varlen") and largest > 2
    assert difference < 1e-4


def test_gguf_export_is_verified_in_llama_cpp_or_refused_in_one_line(arch_dir, packed_run, tmp_path):
    """The trained adapter merged and exported: an architecture or setting llama.cpp's graph cannot compute (a
    sliding window on an architecture it writes without one) is refused in one line; the others are written and
    checked in llama.cpp (tokens, template, logits, greedy), where llama-cpp-python is installed."""
    import importlib.util

    from tunesmith.errors import UserError
    from tunesmith.export.command import run as export
    from tunesmith.export.gguf_arch import architecture
    from tunesmith.models.loader import inference_model_args, load_for_inference

    flags = ["--model_name_or_path", arch_dir, "--adapter_name_or_path", packed_run.args.output_dir,
             "--output_file", str(tmp_path / "model.gguf"), "--dtype", "f32"]
    try:
        architecture(load_for_inference(inference_model_args(arch_dir))[0])
    except UserError as refusal:
        with pytest.raises(UserError, match=r"^export_gguf") as through_the_command:
            export(flags)
        message = str(through_the_command.value)  # the command adds the model's config file
        assert message.startswith(str(refusal).rstrip(".")) and "\n" not in message
        assert not (tmp_path / "model.gguf").exists()
        return
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (bash scripts/setup.sh --with-llama-cpp): the export of this "
                    "architecture is checked in llama.cpp there")
    result = export([*flags, "--require_llama_cpp_check"])
    assert result.llama_cpp is not None and (tmp_path / "model.gguf").is_file()


@pytest.mark.parametrize("name", ["minimax", "bamba", "jamba", "falcon_mamba"])
def test_packing_refuses_layers_that_carry_a_state_across_conversations(name):
    """Linear attention, Mamba: a packed row would carry one conversation's state into the next (MiniMax's packed
    logits differed from eager per conversation by 9.5 where the largest was 8.9)."""
    from transformers import CONFIG_MAPPING

    from tunesmith.errors import ConfigError
    from tunesmith.models.attention import refuse_stateful_layers

    if name not in CONFIG_MAPPING:
        pytest.skip(f"transformers has no {name} config class")
    with pytest.raises(ConfigError, match=rf"^--packing: {name} has .* layers, which carry a state .*--packing false$"):
        refuse_stateful_layers(CONFIG_MAPPING[name]())
    refuse_stateful_layers(CONFIG_MAPPING["gemma3_text"]())  # sliding and full attention layers pack
