"""GGUF files in real llama.cpp (llama-cpp-python, `bash scripts/setup.sh --with-llama-cpp`; skipped with the
reason where it is not installed): tiny random models of each exported architecture, built from their
config classes around the real SmolLM2 tokenizer (Qwen2 and Qwen3 around transformers' Qwen2Tokenizer, as
every real Qwen model's is built), give transformers' logits in llama.cpp; every pre-tokenizer the writer
names splits text as transformers does; the export's own llama.cpp check passes (tokens with special tokens
parsed, CJK and emoji, the chat template, greedy continuations) and catches a wrong pre-tokenizer; a
dropped sliding window shows past the window; k-quants come from llama.cpp's quantizer."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
import transformers

from tests.features.export.test_export_gguf import build_qwen_tokenizer
from tests.features.merge.test_merge import _make_adapter
from tests.helpers.tiny_models import build_spm_tokenizer, build_tiny_model_dir
from tunesmith.export.command import run as export
from tunesmith.export.gguf_arch import ARCHITECTURES
from tunesmith.export.gguf_model import write_gguf

pytestmark = pytest.mark.llama_cpp  # opt-in: bash scripts/test.sh --with-llama-cpp
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (bash scripts/setup.sh "
                                "--with-llama-cpp builds it once)")
from tunesmith.export.gguf_llama_cpp import TOKEN_SAMPLES, load  # noqa: E402
from tunesmith.export.gguf_vocab import PRE_TOKENIZERS  # noqa: E402

_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 2048, "tie_word_embeddings": True}
# HF config class, model class, what differs from the llama default; gemma's window (8) is shorter than the
# prompt, so its sliding layers are exercised. Mistral without a window, as v0.2 and later ship (llama.cpp's
# llama has none; a window is refused, or dropped: test_a_dropped_window_shows_past_the_window).
ARCH_CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, "query_pre_attn_scalar": 16,
                                                         "sliding_window": 8}),
}


# Qwen2/Qwen3 models come with transformers' Qwen2Tokenizer (its NFC normalizer and Qwen's split) and their
# official templates; the others with SmolLM2's tokenizer.
QWEN_TEMPLATES = {"qwen2": "qwen2_5", "qwen3": "qwen3"}


def tiny_model(name: str, tokenizer, seed: int = 0, **overrides):
    config_class, model_class, extra = ARCH_CONFIGS[name]
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                                 eos_token_id=tokenizer.eos_token_id,
                                                 pad_token_id=tokenizer.pad_token_id, **{**_TINY, **extra, **overrides})
    torch.manual_seed(seed)
    return getattr(transformers, model_class)(config).eval()


def tokenizer_for(name: str, tokenizer):
    return build_qwen_tokenizer(tokenizer, QWEN_TEMPLATES[name]) if name in QWEN_TEMPLATES else tokenizer


def test_every_architecture_is_tested_here():
    assert sorted(v[1] for v in ARCH_CONFIGS.values()) == sorted(ARCHITECTURES)


@pytest.mark.parametrize("name", list(ARCH_CONFIGS))
def test_each_architecture_gives_transformers_logits_in_llama_cpp(name, tokenizer, tmp_path):
    tokenizer = tokenizer_for(name, tokenizer)
    model = tiny_model(name, tokenizer)
    path = str(tmp_path / f"{name}.gguf")
    write_gguf(model, tokenizer, path, "f32", name)
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == ARCHITECTURES[type(model).__name__].name
    text = tokenizer.apply_chat_template([{"role": "user", "content": "你好 🙂 count 1 2 3, then 2024 + 365"}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) > 16  # longer than gemma's window of 8
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0]
    llm = load(path, n_ctx=128)
    try:
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids
        llm.eval(ids)
        got = torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))
    finally:
        llm.close()
    # llama.cpp keeps its KV cache in f16: a few 1e-4 of the largest logit, where a wrong rope order, norm
    # offset or window moves logits by a sizable fraction of it.
    assert (got - want).abs().max() <= 5e-3 * want.abs().max(), (got - want).abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("name", list(QWEN_TEMPLATES))
def test_qwen_models_export_and_verify_in_llama_cpp(name, tokenizer, tmp_path):
    """The bug users hit: every real Qwen2/Qwen3 tokenizer (NFC first) was refused. Exported as llama.cpp's
    converter writes it (pre-tokenizer qwen2, the normalizer left out: llama.cpp applies none) and checked
    there: tokens of the conversations and samples, the official template, greedy continuations."""
    qwen = tokenizer_for(name, tokenizer)
    folder = tmp_path / name
    tiny_model(name, qwen).save_pretrained(folder)
    qwen.save_pretrained(folder)
    out = tmp_path / f"{name}.gguf"
    result = export(["--model_name_or_path", str(folder), "--output_file", str(out), "--dtype", "f16",
                     "--require_llama_cpp_check"])
    assert gguf.GGUFReader(out).fields["tokenizer.ggml.pre"].contents() == "qwen2"
    check = result.llama_cpp
    assert check.token_mismatch is None and check.template_equal
    assert check.greedy_steps == 4 * 16 and check.decisive_disagreements == 0


@pytest.mark.parametrize("pre", list(PRE_TOKENIZERS))
def test_every_pre_tokenizer_the_writer_names_splits_in_llama_cpp_as_in_transformers(pre, tokenizer, tmp_path,
                                                                                     monkeypatch):
    """Each tokenizer.json shape export_gguf translates (SmolLM2's vocabulary behind each pre-tokenizer, NFC
    first as Qwen's), written with llama.cpp's name for it, tokenizes the samples (llama.cpp's own probe,
    CJK, emoji, digit runs, code) and a chat as transformers does. The names come from the shapes alone here:
    with this vocabulary, which merges no digits, the gpt-2 shape's ids hash as SmolLM2's ("smollm")."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from tunesmith.export import gguf_vocab

    monkeypatch.setattr(gguf_vocab, "KNOWN_HASHES", {})

    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    steps = [{"trim_offsets": True, **step} if step["type"] == "ByteLevel" else step for step in PRE_TOKENIZERS[pre][0]]
    backend["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": steps}
    backend["normalizer"] = {"type": "NFC"} if pre == "qwen2" else None
    shaped = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(backend)),
                                     eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    shaped.chat_template = tokenizer.chat_template
    path = str(tmp_path / f"{pre}.gguf")
    write_gguf(tiny_model("llama", shaped), shaped, path, "f32", pre)
    assert gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents() == pre
    chat = shaped.apply_chat_template([{"role": "user", "content": "x=1; y = 22 + 333 - 4444"}], tokenize=False)
    llm = load(path, n_ctx=512)
    try:
        for text in [chat, *TOKEN_SAMPLES]:
            assert llm.tokenize(text.encode(), add_bos=False, special=True) == shaped(text)["input_ids"], text[:40]
    finally:
        llm.close()


def test_a_dropped_window_shows_past_the_window(tokenizer, tmp_path):
    """Why a Mistral window is refused: llama.cpp's llama attends to the whole context, so the file written
    with --drop_sliding_window matches transformers up to the window and no further."""
    model = tiny_model("mistral", tokenizer, sliding_window=8)
    path = str(tmp_path / "m.gguf")
    write_gguf(model, tokenizer, path, "f32", "m", drop_sliding_window=True)
    ids = tokenizer("The quick brown fox jumps over the lazy dog, then runs far away.")["input_ids"]
    assert len(ids) >= 12
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0]
    llm = load(path, n_ctx=64)
    try:
        llm.eval(ids)
        got = torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))
    finally:
        llm.close()
    diff = (got - want).abs().amax(-1) / want.abs().max()
    assert diff[:8].max() <= 5e-3 and diff[8:].min() > 5e-2, diff


@pytest.mark.parametrize("name, add_prefix", [("gemma2", False), ("llama", True)], ids=["gemma-style", "llama2-style"])
def test_sentencepiece_style_vocabularies_tokenize_in_llama_cpp_as_in_transformers(name, add_prefix, tmp_path):
    from tunesmith.export.gguf_llama_cpp import check_in_llama_cpp, greedy_references

    tokenizer = build_spm_tokenizer(add_prefix)
    model = tiny_model(name, tokenizer)
    path = str(tmp_path / "spm.gguf")
    write_gguf(model, tokenizer, path, "f32", "spm")
    reader = gguf.GGUFReader(path)
    assert reader.fields["tokenizer.ggml.model"].contents() == "llama"
    assert reader.fields["tokenizer.ggml.add_space_prefix"].contents() is add_prefix
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": "你好 world  two  spaces\n\nnew 🙂"},
                                            {"role": "assistant", "content": "Hi!"}], tokenize=False),
             " leading space", "x  y\n\nz"]
    refs = greedy_references(model, tokenizer, [texts[0]], 8)
    check = check_in_llama_cpp(path, tokenizer, texts, refs)  # CJK, emoji (byte fallback) and llama.cpp's probe
    assert check.token_mismatch is None and check.template_equal and check.decisive_disagreements == 0


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_architectures_transformers_cannot_read_back_are_exported_on_llama_cpps_check(name, tokenizer, tmp_path,
                                                                                         caplog):
    # qwen3 with head_dim != hidden / heads: transformers' loader builds the wrong shapes; gemma3: it drops
    # settings the file carries. llama.cpp's check decides alone, and a warning says so.
    folder = tmp_path / name
    tiny_model(name, tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    result = export(["--model_name_or_path", str(folder), "--output_file", str(tmp_path / f"{name}.gguf"),
                     "--dtype", "f16"])
    assert result.round_trip is None and result.llama_cpp.decisive_disagreements == 0
    assert result.llama_cpp.token_mismatch is None and result.llama_cpp.template_equal
    assert "not read back with transformers' GGUF loader" in caplog.text


def test_export_checks_tokens_template_and_greedy_in_llama_cpp(tiny_model_dir, tokenizer, tmp_path):
    result = export(["--model_name_or_path", tiny_model_dir, "--output_file", str(tmp_path / "t.gguf"),
                     "--dtype", "f32"])
    check = result.llama_cpp
    assert check.version == llama_cpp.__version__ and check.token_mismatch is None and check.template_equal
    assert check.greedy_steps == 4 * 16 and check.decisive_disagreements == 0
    assert check.max_abs_diff <= 1e-2 * check.logit_scale
    assert any(ord(c) > 0x3000 for c in TOKEN_SAMPLES[1])  # CJK and emoji are in the token sample


def test_a_wrong_pre_tokenizer_is_caught_in_llama_cpp(tokenizer, tmp_path, monkeypatch):
    """A pre-tokenizer name llama.cpp knows but splits by differently from HF shows up as a token mismatch
    (qwen2's split glues punctuation to the next word). The name itself was the bug users hit: "gpt2",
    which llama.cpp does not know ("gpt-2" does, and for SmolLM2's vocabulary, which has no merges across
    digits, splits as "smollm" does)."""
    from tunesmith.export import gguf_llama_cpp, gguf_vocab

    model = tiny_model("llama", tokenizer)
    smollm = next(h for h, name in gguf_vocab.KNOWN_HASHES.items() if name == "smollm")
    monkeypatch.setattr(gguf_vocab, "KNOWN_HASHES", {smollm: "qwen2"})
    path = str(tmp_path / "qwen2-split.gguf")
    write_gguf(model, tokenizer, path, "f32", "x")
    assert gguf.GGUFReader(path).fields["tokenizer.ggml.pre"].contents() == "qwen2"
    refs = gguf_llama_cpp.greedy_references(model, tokenizer, ["Hello"], 2)
    check = gguf_llama_cpp.check_in_llama_cpp(path, tokenizer, ["Hello"], refs)
    # Sample 2 is llama.cpp's own pre-tokenizer probe (convert_hf_to_gguf's chktxt).
    assert check.token_mismatch.startswith("sample 2 (add_special_tokens=False) from token 11: [2367, 3914, 198] in "
                                           "transformers, [48279, 3717, 10813] in llama.cpp")


@pytest.fixture(scope="module")
def k_quantizable_dir(tmp_path_factory, tokenizer) -> str:
    # k-quants work on rows of 256 (llama.cpp falls back to q8_0 for the tiny model's 64)
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-256"), tokenizer, hidden_size=256)


@pytest.mark.parametrize("dtype", ["q4_k_m", "q6_k"])
def test_k_quants_come_from_llama_cpps_quantizer(dtype, k_quantizable_dir, tmp_path):
    out = tmp_path / f"t-{dtype}.gguf"
    result = export(["--model_name_or_path", k_quantizable_dir, "--output_file", str(out), "--dtype", dtype])
    assert result.llama_cpp.decisive_disagreements == 0  # the f16 file it was made from
    assert result.quantized.token_mismatch is None and result.quantized.template_equal
    reader = gguf.GGUFReader(out)
    want = {"q4_k_m": ("MOSTLY_Q4_K_M", "Q4_K"), "q6_k": ("MOSTLY_Q6_K", "Q6_K")}[dtype]
    assert reader.fields["general.file_type"].contents() == int(gguf.LlamaFileType[want[0]])
    assert gguf.GGMLQuantizationType[want[1]] in {t.tensor_type for t in reader.tensors}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"t-{dtype}.Modelfile", f"t-{dtype}.gguf"]  # no f16 left


def test_an_adapter_alone_over_its_base_answers_as_the_merged_model(tiny_model_dir, tokenizer, tmp_path):
    adapter = _make_adapter(tiny_model_dir, tokenizer, str(tmp_path / "adapter"))
    out = tmp_path / "adapter.gguf"
    result = export(["--model_name_or_path", adapter, "--output_file", str(out), "--dtype", "f32", "--adapter_only"])
    check = result.llama_cpp
    assert check.token_mismatch is None and check.template_equal
    assert check.greedy_steps == 4 * 16 and check.decisive_disagreements == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "adapter.gguf"]  # the check's base is gone


@pytest.mark.slow
def test_the_default_model_runs_in_llama_cpp_as_in_transformers(tmp_path):
    """The bug users hit: llama.cpp refused the default model's GGUF (`unknown pre-tokenizer type: 'gpt2'`)."""
    out = tmp_path / "smollm2.gguf"
    result = export(["--output_file", str(out), "--dtype", "f16"])
    assert gguf.GGUFReader(out).fields["tokenizer.ggml.pre"].contents() == "smollm"
    check = result.llama_cpp
    assert check.token_mismatch is None and check.template_equal and check.decisive_disagreements == 0
    assert check.greedy_agree >= check.greedy_steps - 2  # f16: at most a near-tie or two among 64 steps
    assert "Paris" in check.continuations[0]  # "What is the capital of France? Answer in one word."
