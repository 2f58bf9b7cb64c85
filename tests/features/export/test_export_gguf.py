"""GGUF export: the file read back with transformers' GGUF loader gives the source's logits (f32 exactly,
f16 and q8_0 within their bounds), the same token ids and the training chat template; an adapter is
merged first; a Modelfile with the ChatML template, default system prompt and stop token goes beside
it; other architectures and tokenizers are refused by name, Qwen's NFC tokenizers written as llama.cpp's
qwen2, a sliding window llama.cpp would not apply refused by name unless dropped; a file that could not be
checked says so in one line (an error with --require_llama_cpp_check); a refused export leaves nothing behind."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
from pathlib import Path

import gguf
import pytest
import torch
import transformers
import trl
from peft import PeftModel
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from tests.cli.test_cli_errors import assert_one_line_error, cli
from tests.features.merge.test_merge import _make_adapter
from tunesmith.data.template import BUILTIN_TEMPLATES, render_text
from tunesmith.errors import ConfigError, ExportError, PathError
from tunesmith.export.args import EXPORT_RELATIVE_TOLERANCES, ExportArguments, ExportModelArguments
from tunesmith.export.checks import CHECK_CONVERSATIONS, RUN_CONFIG_KEY, read_back_refusal
from tunesmith.export.command import _log_coverage
from tunesmith.export.command import main as export_main
from tunesmith.export.command import run as export
from tunesmith.export.gguf_arch import architecture
from tunesmith.export.gguf_model import RoundTrip, write_gguf
from tunesmith.export.gguf_vocab import PRE_TOKENIZERS, pre_tokenizer_name
from tunesmith.export.ollama import CHATML_GO_TEMPLATE, PROBES, ollama_chat, render_chatml
from tunesmith.export.rules import RULES
from tunesmith.hparams import ModelArguments, check, parse_run
from tunesmith.models.loader import load_tokenizer

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 2048, "tie_word_embeddings": True}


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def build_qwen_tokenizer(tokenizer, template: str):
    """A tokenizer as transformers 5 builds every Qwen2, Qwen2.5 and Qwen3 one: its Qwen2Tokenizer class (the
    NFC normalizer, Qwen2's split regex, byte-level BPE), Qwen's special tokens and added tokens, and the
    official chat template (`template`: qwen2_5 or qwen3, TRL's byte-identical copies), over the default
    model's byte-level vocabulary and merges (`tokenizer`): Qwen's own 151k-token vocabulary, a 7 MB
    tokenizer.json, cannot be downloaded here."""
    from transformers import AddedToken, Qwen2Tokenizer

    bpe = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    qwen = Qwen2Tokenizer(vocab=bpe["vocab"], merges=[tuple(m) for m in bpe["merges"]], unk_token=None,
                          eos_token="<|im_end|>", pad_token="<|endoftext|>")
    qwen.add_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    qwen.add_tokens([AddedToken(t, special=False, normalized=False)
                     for t in ("<tool_call>", "</tool_call>", "<think>", "</think>")])
    qwen.chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{template}.jinja").read_text()
    return qwen


def small_bpe_tokenizer():
    """A byte-level BPE tokenizer (GPT-2's split) of 400 tokens with ChatML's special tokens and template, trained
    here on the check conversations: transformers' GGUF loader reads a file with it back in a second or two,
    where the default model's 49k tokens take it about 15 s."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([m["content"] for c in CHECK_CONVERSATIONS for m in c], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()
    return fast


def tiny_causal_lm(config_class: str, model_class: str, tokenizer, seed: int = 0, **extra):
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                                 eos_token_id=tokenizer.eos_token_id,
                                                 pad_token_id=tokenizer.pad_token_id, **{**TINY, **extra})
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(config).eval()


def test_f32_round_trip_is_exact_with_tokenizer_template_and_modelfile(tiny_model_dir, tokenizer, tmp_path):
    out = tmp_path / "tiny.gguf"
    result = export(["--model_name_or_path", tiny_model_dir, "--output_file", str(out), "--dtype", "f32"])

    check = result.round_trip
    assert check.max_abs_diff == 0 and check.top1_agreement == 1 and check.logit_scale > 0.1
    assert check.token_mismatch is None and check.template_equal
    assert sorted(os.listdir(tmp_path)) == ["tiny.Modelfile", "tiny.gguf"]  # no temporary file left
    assert oct(out.stat().st_mode & 0o777) == "0o644"

    reader = gguf.GGUFReader(out)
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "tokenizer.chat_template") == tokenizer.chat_template  # the training template
    assert _field(reader, "tokenizer.ggml.model") == "gpt2" and _field(reader, "tokenizer.ggml.pre") == "smollm"
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False
    assert _field(reader, "tokenizer.ggml.eos_token_id") == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert json.loads(_field(reader, RUN_CONFIG_KEY))["ExportArguments"]["output_file"] == str(out)
    names = {t.name for t in reader.tensors}
    assert "output.weight" not in names and {"token_embd.weight", "blk.1.attn_q.weight", "output_norm.weight"} <= names

    modelfile = (tmp_path / "tiny.Modelfile").read_text()
    assert "\nFROM ./tiny.gguf\n" in modelfile and 'PARAMETER stop "<|im_end|>"' in modelfile
    assert f'TEMPLATE """{CHATML_GO_TEMPLATE}"""' in modelfile
    assert 'SYSTEM """You are a helpful AI assistant named SmolLM, trained by Hugging Face"""' in modelfile


def test_adapter_is_merged_then_exported_as_q8_0_within_its_bound(tiny_model_dir, tokenizer, tmp_path):
    adapter = _make_adapter(tiny_model_dir, tokenizer, str(tmp_path / "adapter"))
    out = tmp_path / "out" / "adapter.gguf"
    result = export(["--model_name_or_path", adapter, "--output_file", str(out), "--dtype", "q8_0"])

    check = result.round_trip
    assert 0 < check.relative_diff <= EXPORT_RELATIVE_TOLERANCES["q8_0"] and check.token_mismatch is None
    reader = gguf.GGUFReader(out)
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_down.weight"] == types["token_embd.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32  # norms stay f32
    assert sum(t.n_bytes for t in reader.tensors) < 0.3 * 4 * sum(t.n_elements for t in reader.tensors)  # 8.5 bits

    # The file holds base + adapter, not the base: a projection read straight from it (V is stored in HF's
    # row order) is the merged weight, within q8_0's rounding, and the adapter moved it by more than that.
    stored = next(t for t in reader.tensors if t.name == "blk.0.attn_v.weight")
    stored = torch.from_numpy(gguf.dequantize(stored.data, stored.tensor_type).reshape(stored.data.shape[0], -1))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter).merge_and_unload()
    want = merged.model.layers[0].self_attn.v_proj.weight.detach()
    rounding = (stored - want).abs().max()
    assert rounding <= want.abs().max() / 127
    assert (want - base.model.layers[0].self_attn.v_proj.weight).abs().max() > 10 * rounding


def test_an_adapter_alone_is_llama_cpps_adapter_gguf(tiny_model_dir, tokenizer, tmp_path):
    adapter = _make_adapter(tiny_model_dir, tokenizer, str(tmp_path / "adapter"))
    out = tmp_path / "adapter.gguf"
    export(["--model_name_or_path", adapter, "--output_file", str(out), "--dtype", "f16", "--adapter_only"])
    reader = gguf.GGUFReader(out)
    assert _field(reader, "general.type") == "adapter" and _field(reader, "adapter.type") == "lora"
    assert _field(reader, "general.architecture") == "llama" and _field(reader, "adapter.lora.alpha") == 8.0
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 2 * 7 * 2 and "tokenizer.ggml.tokens" not in reader.fields  # A and B of 7 linears x 2 layers
    a, b = tensors["blk.0.attn_v.weight.lora_a"], tensors["blk.0.attn_v.weight.lora_b"]
    assert a.tensor_type == b.tensor_type == gguf.GGMLQuantizationType.F16
    assert list(a.shape) == [64, 4] and list(b.shape) == [4, 32]  # ggml order: (in, r) and (r, out)
    # V is stored in HF's row order: B as PEFT saved it, within f16's rounding.
    from safetensors.torch import load_file
    want = load_file(os.path.join(adapter, "adapter_model.safetensors"))[
        "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"]
    assert torch.allclose(torch.from_numpy(b.data.astype("float32")).reshape(want.shape), want, atol=1e-3)
    with pytest.raises(ConfigError, match=r"--adapter_only writes the adapter's matrices in f32 or f16 \(got --dtype "
                                          r"q8_0\)"):
        parse_run("export", ["--model_name_or_path", adapter, "--output_file", str(tmp_path / "q.gguf"),
                             "--dtype", "q8_0", "--adapter_only"])


def test_adapters_llama_cpp_cannot_apply_alone_are_refused_by_name():
    from types import SimpleNamespace

    from tunesmith.export.gguf_adapter import _check_config

    plain = {"lora_alpha": 8, "r": 4, "use_dora": False, "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None}
    assert _check_config(SimpleNamespace(**plain)) == 8.0
    assert _check_config(SimpleNamespace(**plain, use_rslora=True)) == 16.0  # llama.cpp divides by r, rsLoRA by sqrt(r)
    with pytest.raises(ConfigError, match="this one sets use_dora, which llama.cpp's adapter GGUF does not carry: "
                                          r"export it merged \(leave out --adapter_only\)"):
        _check_config(SimpleNamespace(**{**plain, "use_dora": True}))
    with pytest.raises(ConfigError, match="this one sets trainable_token_indices, which llama.cpp's adapter GGUF"):
        _check_config(SimpleNamespace(**{**plain, "trainable_token_indices": {"model.embed_tokens": [42]}}))


def test_export_over_its_bound_is_refused_and_leaves_nothing(tiny_model_dir, tmp_path):
    out = tmp_path / "tiny.gguf"
    with pytest.raises(ExportError, match=r"does not match it: max \|logit difference\| .* above the bound 1e-09; "
                                          r"nothing written") as refused:
        export(["--model_name_or_path", tiny_model_dir, "--output_file", str(out), "--dtype", "f16",
                "--max_relative_logit_diff", "1e-9"])
    assert os.listdir(tmp_path) == []  # neither the file, nor the rejected temporary one, nor a Modelfile
    # What it refused: an f16 round trip that the default bound accepts.
    relative = float(re.search(r"is (\S+) of the largest", str(refused.value)).group(1))
    assert 0 < relative <= EXPORT_RELATIVE_TOLERANCES["f16"]


def test_other_architectures_and_existing_files_are_refused_before_loading(tiny_model_dir, tmp_path):
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "config.json").write_text(json.dumps({"architectures": ["PhiForCausalLM"], "model_type": "phi"}))
    proc = cli("merge/export_gguf.py", "--model_name_or_path", str(qwen), "--output_file", "q.gguf", cwd=tmp_path)
    assert_one_line_error(proc, "config error: export_gguf supports LlamaForCausalLM, MistralForCausalLM, "
                          "Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM; this model "
                          "is PhiForCausalLM")
    (tmp_path / "taken.Modelfile").write_text("FROM ./other.gguf\n")
    with pytest.raises(PathError, match=r"taken.Modelfile exists: choose another --output_file, or pass "
                                          r"--overwrite_output_file"):
        export(["--model_name_or_path", tiny_model_dir, "--output_file", str(tmp_path / "taken.gguf")])
    with pytest.raises(ConfigError, match=r"name it \*.gguf"):
        export(["--model_name_or_path", tiny_model_dir, "--output_file", str(tmp_path / "model.bin")])


def test_the_export_rows_are_checked_for_the_export_command_only():
    """Export's rows live in tunesmith/export/rules.py: the parser checks them after the core's for `tunesmith
    export`, and the core's table alone no longer holds them."""
    model, args = ExportModelArguments(), ExportArguments(output_file="model.bin")
    check(model=model, export=args)  # the core's rows: nothing to say about the file name
    with pytest.raises(ConfigError, match=r"name it \*.gguf"):
        check(model=model, export=args, feature_rules=RULES)
    with pytest.raises(ConfigError, match=r"name it \*.gguf"):
        parse_run("export", ["--output_file", "model.bin"])


def test_tokenizers_llama_cpp_would_split_differently_are_refused_by_name():
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    bpe = {"type": "BPE", "byte_fallback": False}
    assert pre_tokenizer_name({"model": bpe, "pre_tokenizer": byte_level}) == "gpt-2"
    digits = {"type": "Digits", "individual_digits": True}
    assert pre_tokenizer_name({"model": bpe, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        digits, byte_level]}}) == "smollm"  # SmolLM2's own tokenizer.json
    split = {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Isolated"}
    with pytest.raises(ConfigError, match=r"this tokenizer's is Sequence\[Split, ByteLevel\]"):
        pre_tokenizer_name({"model": bpe, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]}})
    with pytest.raises(ConfigError, match="and SentencePiece-style ones .*; this one is BPE with byte fallback, which"):
        pre_tokenizer_name({"model": {"type": "BPE", "byte_fallback": True}, "pre_tokenizer": None})
    spaces = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    assert pre_tokenizer_name({"model": {"type": "BPE", "byte_fallback": True}, "normalizer": spaces}) == "spm"
    # NFC, which llama.cpp neither applies nor needs named (Qwen's), passes; a normalizer that changes text
    # llama.cpp would then see unchanged does not.
    qwen2 = {"model": bpe, "pre_tokenizer": {"type": "Sequence", "pretokenizers": PRE_TOKENIZERS["qwen2"][0]}}
    assert pre_tokenizer_name({**qwen2, "normalizer": {"type": "NFC"}}) == "qwen2"
    with pytest.raises(ConfigError, match=r"this one is BPE and a Sequence\[NFKC, Lowercase\] normalizer, which"):
        pre_tokenizer_name({**qwen2, "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"},
                                                                                       {"type": "Lowercase"}]}})


def test_qwen_tokenizers_with_their_nfc_normalizer_are_written_as_llama_cpps_qwen2(tokenizer, tmp_path):
    """transformers 5's Qwen2Tokenizer (every Qwen2/2.5/3 model's) puts NFC first: written as llama.cpp's
    converter writes it, with the qwen2 pre-tokenizer, Qwen's tokens and its official template (Qwen2's
    architecture and template too in test_export_llama_cpp.py, checked in llama.cpp)."""
    qwen = build_qwen_tokenizer(tokenizer, "qwen3")
    assert json.loads(qwen.backend_tokenizer.to_str())["normalizer"] == {"type": "NFC"}
    model = tiny_causal_lm("Qwen3Config", "Qwen3ForCausalLM", qwen)
    path = tmp_path / "qwen.gguf"
    write_gguf(model, qwen, str(path), "f32", "qwen3")
    reader = gguf.GGUFReader(path)
    assert _field(reader, "general.architecture") == "qwen3"
    assert _field(reader, "tokenizer.ggml.model") == "gpt2" and _field(reader, "tokenizer.ggml.pre") == "qwen2"
    assert _field(reader, "tokenizer.ggml.pretokenizer") == PRE_TOKENIZERS["qwen2"][1]  # Ollama's split
    assert _field(reader, "tokenizer.chat_template") == qwen.chat_template
    tokens, types = _field(reader, "tokenizer.ggml.tokens"), _field(reader, "tokenizer.ggml.token_type")
    assert types[tokens.index("<|im_end|>")] == gguf.TokenType.CONTROL
    assert types[tokens.index("<think>")] == gguf.TokenType.USER_DEFINED  # an added token, not a special one
    assert _field(reader, "tokenizer.ggml.eos_token_id") == tokens.index("<|im_end|>")
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False and "tokenizer.ggml.bos_token_id" not in reader.fields


def _window_models(tokenizer) -> dict:
    """case: (model, the window refusal's words, or None where the model is written as it is)."""
    def mistral(**kw):
        return tiny_causal_lm("MistralConfig", "MistralForCausalLM", tokenizer, **kw)

    def qwen2(**kw):
        return tiny_causal_lm("Qwen2Config", "Qwen2ForCausalLM", tokenizer, **kw)

    return {
        "mistral window 8": (mistral(sliding_window=8), "MistralForCausalLM has sliding_window 8 on 2 of 2 layers "
                             "(config.json), shorter than its max_position_embeddings 2048, and llama.cpp's llama "
                             "architecture, which it is written as, has no sliding window: pass --drop_sliding_window"),
        "mistral without": (mistral(sliding_window=None), None),
        "mistral window = context": (mistral(sliding_window=2048), None),  # masks nothing
        "qwen2 sliding layers": (qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=1),
                                 "Qwen2ForCausalLM has sliding_window 8 on 1 of 2 layers"),
        "qwen2 use_sliding_window, no layer past max_window_layers": (
            qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=2), None),
    }


def test_a_sliding_window_llama_cpp_would_not_apply_is_refused_by_name_unless_dropped(tokenizer):
    for case, (model, refusal) in _window_models(tokenizer).items():
        if refusal is None:
            assert architecture(model).name in ("llama", "qwen2"), case
            continue
        with pytest.raises(ConfigError, match=re.escape(refusal)):
            architecture(model)
        assert architecture(model, drop_sliding_window=True).name in ("llama", "qwen2"), case


def test_gemma_windows_are_written_per_layer(tmp_path):
    tokenizer = small_bpe_tokenizer()
    model = tiny_causal_lm("Gemma3TextConfig", "Gemma3ForCausalLM", tokenizer, num_hidden_layers=3, head_dim=16,
                           query_pre_attn_scalar=16, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    write_gguf(model, tokenizer, str(tmp_path / "g.gguf"), "f16", "g")
    reader = gguf.GGUFReader(tmp_path / "g.gguf")
    assert _field(reader, "gemma3.attention.sliding_window") == 8
    assert _field(reader, "gemma3.attention.sliding_window_pattern") == [True, False, True]


def test_a_dropped_window_is_written_as_llama_cpp_reads_it_and_said_once(tmp_path, capsys, caplog, monkeypatch):
    # transformers' read-back decides here; llama.cpp's view: test_export_llama_cpp.py, past the window
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    tokenizer = small_bpe_tokenizer()
    folder = tmp_path / "tiny"  # a llama file named "mistral" transformers' GGUF loader reads as mistral, and fails
    tiny_causal_lm("MistralConfig", "MistralForCausalLM", tokenizer, sliding_window=512).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    argv = ["--model_name_or_path", str(folder), "--output_file", str(tmp_path / "m.gguf"), "--dtype", "f32"]
    with pytest.raises(SystemExit) as stopped:
        export_main(argv)
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("tunesmith: config error: export_gguf: MistralForCausalLM has sliding_window 512 on "
                                "2 of 2 layers")
    assert not (tmp_path / "m.gguf").exists()

    # The check's conversations are shorter than the window, where attention is the model's.
    result = export([*argv, "--drop_sliding_window"])
    assert result.round_trip.max_abs_diff == 0
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert _field(reader, "general.architecture") == "llama" and "llama.attention.sliding_window" not in reader.fields
    dropped = [r.getMessage() for r in caplog.records if "sliding window" in r.getMessage()]
    assert dropped == ["written without its sliding window of 512 tokens (--drop_sliding_window): llama.cpp's llama "
                       "attends to the whole context, so answers match the model's only for contexts up to 512 tokens"]


def test_what_was_not_checked_is_one_line(caplog):
    hint = "(bash scripts/setup.sh --with-llama-cpp; --require_llama_cpp_check makes this an error)"
    cases = {("", False): f"checked with transformers' GGUF loader only, not in llama.cpp: llama-cpp-python is not "
                          f"installed {hint}",
             ("it does not rebuild gemma2 with every setting in the file", False):
                 "NOT CHECKED: not read back with transformers' GGUF loader (it does not rebuild gemma2 with every "
                 f"setting in the file), and not in llama.cpp: llama-cpp-python is not installed {hint}",
             ("it does not rebuild gemma2 with every setting in the file", True):
                 "checked in llama.cpp only: not read back with transformers' GGUF loader (it does not rebuild gemma2 "
                 "with every setting in the file)",
             ("", True): None}  # both checks ran: nothing to say
    for (why, in_llama_cpp), message in cases.items():
        caplog.clear()
        _log_coverage(why, in_llama_cpp)
        assert [r.getMessage() for r in caplog.records] == ([message] if message else [])


def test_a_gemma_file_without_llama_cpp_is_written_with_one_not_checked_line(tokenizer, tmp_path, monkeypatch,
                                                                             capsys, caplog):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as where llama-cpp-python is not installed
    folder = tmp_path / "gemma"
    tiny_causal_lm("Gemma3TextConfig", "Gemma3ForCausalLM", tokenizer, head_dim=16, query_pre_attn_scalar=16,
                   sliding_window=8).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with caplog.at_level(logging.WARNING):
        result = export(["--model_name_or_path", str(folder), "--output_file", str(tmp_path / "g.gguf")])
    assert result.round_trip is None and result.llama_cpp is None
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "check" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("NOT CHECKED: not read back with transformers' GGUF loader (it "
                                                 "does not rebuild gemma3"), said
    assert "NOT CHECKED (see the warning above)" in capsys.readouterr().out

    with pytest.raises(SystemExit) as stopped:
        export_main(["--model_name_or_path", str(folder), "--output_file", str(tmp_path / "r.gguf"),
                     "--require_llama_cpp_check"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "tunesmith: config error: --require_llama_cpp_check: llama-cpp-python is not installed, so the GGUF cannot "
        "be checked in llama.cpp: run `bash scripts/setup.sh --with-llama-cpp`, or leave out the flag.")
    assert sorted(os.listdir(tmp_path)) == ["g.Modelfile", "g.gguf", "gemma"]


def test_a_sentencepiece_style_vocabulary_is_written_as_llama_cpps_llama_tokenizer(tmp_path):
    from tests.helpers.tiny_models import build_spm_tokenizer

    tokenizer = build_spm_tokenizer(add_prefix=True)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    write_gguf(model, tokenizer, str(tmp_path / "spm.gguf"), "f32", "spm")
    reader = gguf.GGUFReader(tmp_path / "spm.gguf")
    assert _field(reader, "tokenizer.ggml.model") == "llama" and _field(reader, "tokenizer.ggml.add_space_prefix")
    tokens, types = _field(reader, "tokenizer.ggml.tokens"), _field(reader, "tokenizer.ggml.token_type")
    scores = _field(reader, "tokenizer.ggml.scores")
    assert types[tokens.index("<0x41>")] == gguf.TokenType.BYTE and types[0] == gguf.TokenType.UNKNOWN
    assert types[tokens.index("<|im_end|>")] == gguf.TokenType.CONTROL
    # the first merge's token scores highest: llama.cpp joins pairs in BPE's merge order
    first = "".join(json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"][0])
    assert scores[tokens.index(first)] == 0 == max(scores[i] for i, t in enumerate(types) if t == gguf.TokenType.NORMAL)


def test_modelfile_template_renders_as_training_does(tokenizer):
    chat, why = ollama_chat(tokenizer)
    assert why == "" and chat.stops == ["<|im_end|>"]
    assert chat.system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    for messages in PROBES + CHECK_CONVERSATIONS:
        prompt = messages[-1]["role"] != "assistant"
        assert render_chatml(messages, chat.system, prompt) == render_text(tokenizer, messages, prompt)
    # The Go template: each message as ChatML, the turn left open for the reply, nothing else.
    assert CHATML_GO_TEMPLATE.count("<|im_start|>") == 2 and CHATML_GO_TEMPLATE.count("<|im_end|>") == 1
    assert "<|im_start|>{{ .Role }}\n{{ .Content }}" in CHATML_GO_TEMPLATE and "range $i, $_ := .Messages" in CHATML_GO_TEMPLATE


def test_templates_without_a_translation_are_named(default_model_path):
    other = load_tokenizer(ModelArguments(model_name_or_path=default_model_path))
    other.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    chat, why = ollama_chat(other)
    assert chat is None and "does not render ChatML" in why
    other.chat_template = BUILTIN_TEMPLATES["chatml"].read_text()  # ChatML without a default system prompt
    chat, _ = ollama_chat(other)
    assert chat is not None and chat.system is None


@pytest.mark.parametrize("argv, error, message", [
    ([], ConfigError, "--output_file is required"),
    (["--output_file", "m.gguf", "--quantization_bit", "4"], ConfigError, "--quantization_bit cannot be used with export"),
    (["--output_file", "m.gguf", "--max_relative_logit_diff", "-1"], ConfigError,
     r"--max_relative_logit_diff must be >= 0 \(got -1.0\)"),
    (["--output_file", "m.gguf", "--dtype", "q4_0"], SystemExit, "^2$"),  # argparse lists the choices, exit 2
    (["--output_file", "m.gguf", "--adapter_only"], ConfigError,
     "--adapter_only writes a LoRA adapter, and no adapter was given"),
    pytest.param(["--output_file", "m.gguf", "--dtype", "q4_k_m"], ConfigError,
                 r"--dtype q4_k_m is made by llama.cpp's quantizer, and llama-cpp-python is not installed: run "
                 r"`bash scripts/setup.sh --with-llama-cpp`",
                 marks=pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None,
                                          reason="llama-cpp-python is installed here: k-quants are available")),
], ids=["output_file", "quantized", "tolerance", "dtype", "adapter_only", "k_quant"])
def test_export_settings_that_cannot_work_stop_before_loading(argv, error, message, tiny_model_dir, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=message):
        parse_run("export", ["--model_name_or_path", tiny_model_dir, *argv])


def test_reward_adapters_and_unsupported_llama_settings_are_refused_by_name(tiny_model_dir, tmp_path):
    adapter = tmp_path / "rm"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": tiny_model_dir,
                                                             "task_type": "SEQ_CLS"}))
    with pytest.raises(ConfigError, match=r"is a reward-model adapter \(task_type SEQ_CLS\): export_gguf writes chat"):
        parse_run("export", ["--model_name_or_path", str(adapter), "--output_file", str(tmp_path / "m.gguf")])
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1,
                         rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ConfigError, match="export_gguf writes LlamaForCausalLM models with rope_type default; "
                                          "this one has linear"):
        architecture(LlamaForCausalLM(config))
    from transformers import Gemma2Config, Gemma2ForCausalLM

    gemma = Gemma2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=16)
    with pytest.raises(ConfigError, match="export_gguf writes Gemma2ForCausalLM models with query_pre_attn_scalar 8; "
                                          "this one has 16"):
        architecture(Gemma2ForCausalLM(gemma))


def test_a_different_tokenizer_or_template_in_the_file_is_a_refusal_whatever_the_logits():
    same = RoundTrip(0.0, 10.0, 1.0, None, True)
    assert read_back_refusal(same, 0.0) is None
    tokens = RoundTrip(0.0, 10.0, 1.0, "conversation 2 (add_special_tokens=False) from token 7: [1] in the source, "
                       "[2] in the GGUF", True)
    assert read_back_refusal(tokens, 1.0).startswith("its tokenizer encodes conversation 2")
    assert "chat template differs" in read_back_refusal(RoundTrip(0.0, 10.0, 1.0, None, False), 1.0)
    assert "0.5 of the largest |logit| (10), above the bound 0.1" in read_back_refusal(RoundTrip(5.0, 10.0, 1.0, None, True), 0.1)
