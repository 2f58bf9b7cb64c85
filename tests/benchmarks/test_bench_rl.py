"""benchmarks/rl.py: the tools workload's data, that TRL's tool loop reads tunesmith's chatml_tools calls and
inserts the same tool-result tokens as tunesmith's (so both sides do the same work), the ratio lines, and a smoke run
of every variant on a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import benchmarks.rl as bench_rl
from benchmarks.common import child_env


def test_the_tools_workload_is_the_demo_config_less_what_trl_cannot_do():
    from argparse import Namespace

    work = bench_rl.workload(Namespace(worker="trl_tools_bf16", adapter="none"))
    assert "dynamic_sampling" not in work and "adapter_name_or_path" not in work
    assert work["max_new_tokens"] == work["max_trajectory_tokens"] == bench_rl.TRAJECTORY_TOKENS
    assert work["chat_template"] == "chatml_tools" and work["tool_funcs"] and work["max_tool_calls"] >= 1
    rows = [json.loads(line) for line in Path(work["data_path"]).read_text().splitlines() if line.strip()]
    assert len(rows) >= 2 * 60 and all(float(r["answer"]) for r in rows)  # 60 steps of 2 prompts, each seen once
    assert bench_rl.workload(Namespace(worker="grpo_tools_fp32", adapter="/a"))["adapter_name_or_path"] == "/a"
    plain = bench_rl.workload(Namespace(worker="grpo_bf16", adapter="/a"))
    assert "adapter_name_or_path" not in plain and Path(plain["data_path"]).is_absolute()


def test_trl_reads_the_calls_of_chatml_tools_and_inserts_the_results_as_tunesmith_does(default_model_path):
    """The prompt, the parsed call and the tokens after it (the tool's result, the next assistant header) are the
    same on both sides of the tools workload."""
    from transformers.utils import get_json_schema
    from trl import GRPOTrainer
    from trl.chat_template_utils import parse_response

    from tunesmith.data.template import encode_prompt
    from tunesmith.data.tool_calls import parse_calls
    from tunesmith.hparams import ModelArguments
    from tunesmith.models.loader import load_tokenizer
    from tunesmith.rl.tool_funcs import multiply
    from tunesmith.rl.tool_rollout import continuation_ids

    ours = load_tokenizer(ModelArguments(model_name_or_path=default_model_path, chat_template="chatml_tools"))
    trl = bench_rl.trl_tokenizer(SimpleNamespace(model=default_model_path))
    schema = get_json_schema(multiply)
    messages = [{"role": "user", "content": "What is 347 times 29?"}]
    prompt = encode_prompt(ours, messages, [schema])
    assert trl.apply_chat_template(messages, tools=[multiply], add_generation_prompt=True, tokenize=True,
                                   return_dict=False) == prompt

    text = 'Let me see.\n<tool_call>{"name": "multiply", "arguments": {"a": 347, "b": 29}}</tool_call>'
    call = ours(text, add_special_tokens=False)["input_ids"] + [ours.eos_token_id]
    parsed = parse_response(trl, call, prefix=prompt, tools=[multiply])
    assert parsed["content"] == "Let me see."
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "multiply",
                                                                       "arguments": {"a": 347, "b": 29}}}]
    content, [mine] = parse_calls(text, ["multiply"])
    assert (content, mine.name, json.loads(mine.arguments)) == ("Let me see.", "multiply", {"a": 347, "b": 29})

    # TRL sends str(result), tunesmith result_text(result): the same text for a number
    result = str(multiply(347, 29))
    trainer = SimpleNamespace(processing_class=trl, _tokenizer=trl, chat_template=None, chat_template_kwargs={},
                              _is_vlm=False)
    theirs = GRPOTrainer._get_tool_suffix_ids(trainer, [{"role": "tool", "name": "multiply", "content": result}])
    turn = {"role": "assistant", "content": content, "tool_calls": [mine.openai() | {"function": {
        "name": mine.name, "arguments": json.loads(mine.arguments)}}]}
    inserted, exact = continuation_ids(ours, [*messages, turn], [{"role": "tool", "name": "multiply",
                                                                  "content": result}], [schema], prompt + call,
                                       ours.eos_token_id)
    assert exact and inserted == theirs
    assert ours.decode(inserted) == "\n<|im_start|>tool\n10063<|im_end|>\n<|im_start|>assistant\n"


def run(variant: str, speed: float, rss: float) -> dict:
    return {"completions_per_s": speed, "seconds_per_step": 16 / speed, "rewards": [0.5, 1.0],
            "tool_calls": [1.0, 0.5] if "tools" in variant else [], "bf16": True, "peak_rss_mb": rss,
            "other_cpu": 0.0}


def test_the_table_ends_with_both_ratios_against_trl(capsys):
    results = {v: [run(v, speed, rss)] for v, speed, rss in (("grpo_bf16", 3.0, 1000.0), ("trl_bf16", 1.5, 2000.0),
                                                             ("grpo_tools_bf16", 2.0, 1500.0),
                                                             ("trl_tools_bf16", 1.0, 2500.0))}
    bench_rl.print_table(results, 0.1)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-4:] == ["peak RSS ratio vs TRL GRPOTrainer: 0.50", "peak RSS ratio vs TRL GRPOTrainer (tools): 0.60",
                          "completions/s ratio vs TRL GRPOTrainer: 2.00",
                          "completions/s ratio vs TRL GRPOTrainer (tools): 2.00"]
    row = next(line for line in lines if line.startswith("grpo_tools_bf16 "))
    assert row.endswith("0.50 1.00; tool calls per completion 1.00 0.50")


def test_a_loss_the_two_trainers_define_apart_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench_rl.parse(["--loss_type", "cispo"])
    assert "invalid choice: 'cispo'" in capsys.readouterr().err


@pytest.mark.heavy  # ~5 min on a busy 2-core CPU: a worker per variant (10), each importing TRL; -m heavy
def test_every_variant_runs_a_step_on_a_tiny_model(tmp_path, tiny_model_dir):
    variants = [v for v in bench_rl.VARIANTS if v not in bench_rl.COLOCATED_VARIANTS]  # those need vLLM's venv
    done = subprocess.run([sys.executable, "-m", "benchmarks.rl", "--model", tiny_model_dir, "--adapter", "none",
                           "--variants", ",".join(variants), "--steps", "1", "--repeats", "1",
                           "--settle", "0"], capture_output=True, text=True, timeout=1200, cwd=tmp_path,
                          env=child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "failed" not in out, out
    for variant in variants:
        row = next(line for line in out.splitlines() if line.startswith(variant + " "))
        assert ("; tool calls per completion " in row) == ("tools" in variant), row
    assert "float32 both: completions/s ratio" in out and "float32 both (tools): completions/s ratio" in out
    assert "GRPO / PPO (bf16)" in out and "GRPO / PPO (fp32)" in out
    lines = out.strip().splitlines()
    assert lines[-2].startswith("completions/s ratio vs TRL GRPOTrainer: ")
    assert lines[-1].startswith("completions/s ratio vs TRL GRPOTrainer (tools): ")
