"""GGUF export of vision-language models: the language model as a text GGUF and the vision tower + projector as
llama.cpp's mmproj file, for tiny random Qwen2-VL, Gemma 3 and Idefics3 models (tests/helpers/vlm_models.py).

Without llama.cpp (the default suite): both files read back with gguf.GGUFReader hold the model's settings under
llama.cpp's keys and its weights under llama.cpp's names, reshaped as llama.cpp's converter reshapes them (Qwen2-VL's
fused qkv and 3D patch embedding split, Gemma 3's projector norm + 1); other vision types, adapters and k-quants are
refused in one line; the Modelfile names both files.

With llama.cpp's multimodal library (llama-cpp-python built with mtmd; skipped with the reason otherwise): llama.cpp
reading the two files sees the same picture as transformers (image embeddings, the prompt's layout) and gives
transformers' greedy reply to it; a projector from other weights is caught; `tunesmith export` writes and checks
both files end to end."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForImageTextToText

from tests.helpers.vlm_models import build_vlm_dir
from tunesmith.data.template import processor_of
from tunesmith.errors import ConfigError, PathError
from tunesmith.export.command import run as export
from tunesmith.export.gguf_mtmd import mtmd_available
from tunesmith.export.gguf_vision import PROJECTORS, write_vision_gguf
from tunesmith.export.rules import EXPORTABLE_VISION_TYPES
from tunesmith.hparams import ModelArguments
from tunesmith.models.loader import load_tokenizer

# Idefics3's files are written, not exported (gguf_vision says why); Qwen2.5-VL's are both
WRITTEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "gemma3", "idefics3")
QWEN = ("qwen2_vl", "qwen2_5_vl")
PROJECTOR_TYPES = {"qwen2_vl": gguf.VisionProjectorType.QWEN2VL, "qwen2_5_vl": gguf.VisionProjectorType.QWEN25VL,
                   "gemma3": gguf.VisionProjectorType.GEMMA3, "idefics3": gguf.VisionProjectorType.IDEFICS3}
TEXT_ARCHS = {"qwen2_vl": gguf.MODEL_ARCH.QWEN2VL, "qwen2_5_vl": gguf.MODEL_ARCH.QWEN2VL,
              "gemma3": gguf.MODEL_ARCH.GEMMA3, "idefics3": gguf.MODEL_ARCH.LLAMA}
_V = gguf.MODEL_TENSOR


def exportable_dir(family: str, path: Path, base_dir: str) -> str:
    """A tiny model of `family` as a trained one would be: from_config leaves the padding token's embedding row at
    zero (a trained model's is not), and llama.cpp's qwen2vl graph turns an all-zero row into NaN logits; Gemma 3's
    query_pre_attn_scalar set to its head_dim (the real models' relation, and the only one llama.cpp computes)."""
    build_vlm_dir(family, path, base_dir, seed=1)
    model = AutoModelForImageTextToText.from_pretrained(path)
    rows = model.get_input_embeddings().weight
    with torch.no_grad():
        zero = (rows.abs().sum(1) == 0).nonzero().flatten()
        rows[zero] = torch.randn(len(zero), rows.shape[1], generator=torch.Generator().manual_seed(0)) * 0.2
    if family == "gemma3":
        model.config.text_config.query_pre_attn_scalar = model.config.text_config.head_dim
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory, default_model_path) -> dict[str, str]:
    return {f: exportable_dir(f, tmp_path_factory.mktemp(f), default_model_path) for f in WRITTEN_FAMILIES}


_LOADED: dict[str, tuple] = {}


def load(model_dir: str):
    """(model, tokenizer), loaded once per folder: tests that change a model take a copy."""
    if model_dir not in _LOADED:
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
        _LOADED[model_dir] = model, load_tokenizer(ModelArguments(model_name_or_path=model_dir))
    return _LOADED[model_dir]


@pytest.fixture(scope="module")
def written(vlm_dirs, tmp_path_factory) -> dict[str, tuple[str, str]]:
    """(text GGUF, mmproj GGUF) per family, in f32 (so that every tensor can be compared exactly)."""
    out = tmp_path_factory.mktemp("gguf")
    files = {}
    for family, folder in vlm_dirs.items():
        model, tokenizer = load(folder)
        files[family] = (str(out / f"{family}.gguf"), str(out / f"mmproj-{family}.gguf"))
        write_vision_gguf(model, tokenizer, processor_of(tokenizer).image_processor, *files[family], "f32", family)
    return files


def fields(reader: gguf.GGUFReader, skip: str = "tokenizer.ggml.") -> dict:
    """The file's keys and values, without the vocabulary's (slow to read, and gguf_vocab's tests cover them)."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith(skip)}


def tensors(reader: gguf.GGUFReader) -> dict[str, np.ndarray]:
    """Each tensor as a float32 array in PyTorch's (out, in, ...) layout."""
    return {t.name: np.asarray(t.data, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
            for t in reader.tensors}


def name(key: gguf.MODEL_TENSOR, suffix: str = ".weight", bid: int | None = None) -> str:
    return gguf.TENSOR_NAMES[key].format(bid=bid) + suffix


def test_the_writer_knows_every_family_built_here_and_every_exported_type():
    assert EXPORTABLE_VISION_TYPES == ("qwen2_vl", "qwen2_5_vl", "gemma3")
    assert tuple(PROJECTORS) == WRITTEN_FAMILIES


@pytest.mark.parametrize("family", WRITTEN_FAMILIES)
def test_the_mmproj_file_has_the_towers_settings_under_llama_cpps_keys(family, vlm_dirs, written):
    model, tokenizer = load(vlm_dirs[family])
    v, text = model.config.vision_config, model.config.text_config
    image_processor = processor_of(tokenizer).image_processor
    got = fields(gguf.GGUFReader(written[family][1]))
    K, KV = gguf.Keys.Clip, gguf.Keys.ClipVision
    assert got[gguf.Keys.General.ARCHITECTURE] == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ]
    assert got[gguf.Keys.General.TYPE] == gguf.GGUFType.MMPROJ
    assert got[K.PROJECTOR_TYPE] == PROJECTOR_TYPES[family]
    assert got[K.HAS_VISION_ENCODER] is True
    assert got[KV.PROJECTION_DIM] == text.hidden_size
    assert got[KV.PATCH_SIZE] == v.patch_size
    assert got[KV.IMAGE_MEAN] == pytest.approx(list(image_processor.image_mean))
    assert got[KV.IMAGE_STD] == pytest.approx(list(image_processor.image_std))
    if family == "qwen2_vl":  # the tower's width is embed_dim; hidden_size is the merger's output
        expected = {KV.EMBEDDING_LENGTH: v.embed_dim, KV.BLOCK_COUNT: v.depth, KV.Attention.HEAD_COUNT: v.num_heads,
                    KV.FEED_FORWARD_LENGTH: v.embed_dim * v.mlp_ratio, KV.SPATIAL_MERGE_SIZE: v.spatial_merge_size}
        assert KV.USE_GELU not in got  # llama.cpp's default activation is quick_gelu, the tower's
    elif family == "qwen2_5_vl":  # hidden_size is the tower's width; SiLU; full attention every 2nd block here
        expected = {KV.EMBEDDING_LENGTH: v.hidden_size, KV.BLOCK_COUNT: v.depth, KV.Attention.HEAD_COUNT: v.num_heads,
                    KV.FEED_FORWARD_LENGTH: v.intermediate_size, KV.SPATIAL_MERGE_SIZE: v.spatial_merge_size,
                    KV.USE_SILU: True, KV.N_WA_PATTERN: 2}
        assert v.fullatt_block_indexes == [1] and KV.USE_GELU not in got
    else:
        expected = {KV.EMBEDDING_LENGTH: v.hidden_size, KV.BLOCK_COUNT: v.num_hidden_layers,
                    KV.Attention.HEAD_COUNT: v.num_attention_heads, KV.FEED_FORWARD_LENGTH: v.intermediate_size,
                    KV.IMAGE_SIZE: v.image_size, KV.Attention.LAYERNORM_EPS: v.layer_norm_eps, KV.USE_GELU: True}
    if family == "gemma3":  # 4x4 patches pooled to 2x2 tokens: 2, not llama.cpp's default 4 (64 -> 16)
        expected[KV.Projector.SCALE_FACTOR] = 2
    if family == "idefics3":
        expected |= {KV.Projector.SCALE_FACTOR: model.config.scale_factor,
                     KV.PREPROC_IMAGE_SIZE: image_processor.size["longest_edge"]}
    assert {k: got.get(k) for k in expected} == pytest.approx(expected)


def _source_tensors(model) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("family", WRITTEN_FAMILIES)
def test_the_mmproj_file_holds_the_tower_and_projector_as_llama_cpps_converter_writes_them(family, vlm_dirs,
                                                                                         written):
    model, _ = load(vlm_dirs[family])
    src, got = _source_tensors(model), tensors(gguf.GGUFReader(written[family][1]))
    assert not any(k.startswith(("blk.", "token_embd", "output")) for k in got)  # nothing of the language model
    if family in QWEN:
        qkv = src["model.visual.blocks.1.attn.qkv.weight"]
        width = qkv.shape[0] // 3
        for k, part in enumerate((_V.V_ENC_ATTN_Q, _V.V_ENC_ATTN_K, _V.V_ENC_ATTN_V)):
            np.testing.assert_array_equal(got[name(part, bid=1)], qkv[k * width:(k + 1) * width])
            np.testing.assert_array_equal(got[name(part, ".bias", bid=1)],
                                          src["model.visual.blocks.1.attn.qkv.bias"][k * width:(k + 1) * width])
        conv = src["model.visual.patch_embed.proj.weight"]  # (out, channels, frames 2, height, width)
        np.testing.assert_array_equal(got[name(_V.V_ENC_EMBD_PATCH)], conv[:, :, 0])
        np.testing.assert_array_equal(got[name(_V.V_ENC_EMBD_PATCH, ".weight.1")], conv[:, :, 1])
        np.testing.assert_array_equal(got[name(_V.V_MMPROJ, bid=2)], src["model.visual.merger.mlp.2.weight"])
        np.testing.assert_array_equal(got[name(_V.V_POST_NORM)], src["model.visual.merger.ln_q.weight"])
        if family == "qwen2_5_vl":  # a gated MLP (one more matrix and bias), RMSNorms (no biases): 16 a block again
            np.testing.assert_array_equal(got[name(_V.V_ENC_FFN_GATE, bid=0)],
                                          src["model.visual.blocks.0.mlp.gate_proj.weight"])
            assert not any(k.endswith("ln1.bias") or k.endswith("ln2.bias") for k in got)
            expected = 2 + 16 * model.config.vision_config.depth + 1 + 4  # ln_q: a weight only
        else:
            expected = 2 + 16 * model.config.vision_config.depth + 2 + 4  # patch frames, blocks, ln_q, merger
    else:
        tower = "model.vision_tower." if family == "gemma3" else "model.vision_model."
        np.testing.assert_array_equal(got[name(_V.V_ENC_EMBD_PATCH)], src[tower + "embeddings.patch_embedding.weight"])
        np.testing.assert_array_equal(got[name(_V.V_ENC_ATTN_Q, bid=1)],
                                      src[tower + "encoder.layers.1.self_attn.q_proj.weight"])
        np.testing.assert_array_equal(got[name(_V.V_ENC_FFN_DOWN, bid=0)], src[tower + "encoder.layers.0.mlp.fc2.weight"])
        np.testing.assert_array_equal(got[name(_V.V_POST_NORM)], src[tower + "post_layernorm.weight"])
        expected = 3 + 16 * model.config.vision_config.num_hidden_layers + 2  # embeddings, blocks, post norm
    if family == "gemma3":
        # Gemma's RMSNorm scales by 1 + w, ggml's by w; the input projection is used as x @ W, written as it is
        np.testing.assert_array_equal(got[name(_V.V_MM_SOFT_EMB_NORM)],
                                      src["model.multi_modal_projector.mm_soft_emb_norm.weight"] + 1)
        # kept f16 whatever the dtype, as the converter keeps it (llama.cpp issue 13025)
        np.testing.assert_array_equal(got[name(_V.V_MM_INP_PROJ)], src["model.multi_modal_projector."
                                      "mm_input_projection_weight"].astype(np.float16).astype(np.float32))
        assert not any("head" in k for k in got)  # the tower's pooling head is unused by Gemma 3
        expected += 2
    if family == "idefics3":
        np.testing.assert_array_equal(got[name(_V.V_MMPROJ_FC)], src["model.connector.modality_projection.proj.weight"])
        expected += 1
    assert len(got) == expected


@pytest.mark.parametrize("family", EXPORTABLE_VISION_TYPES)  # Idefics3's is llama, which test_export_gguf covers
def test_the_text_gguf_is_the_language_model_in_llama_cpps_architecture_for_it(family, vlm_dirs, written):
    model, tokenizer = load(vlm_dirs[family])
    text = model.config.text_config
    reader = gguf.GGUFReader(written[family][0])
    got, arch = fields(reader), gguf.MODEL_ARCH_NAMES[TEXT_ARCHS[family]]
    assert got[gguf.Keys.General.ARCHITECTURE] == arch
    assert got[gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)] == text.num_hidden_layers
    assert got[gguf.Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)] == text.hidden_size
    assert reader.fields[gguf.Keys.Tokenizer.CHAT_TEMPLATE].contents() == tokenizer.chat_template
    sections = got.get(gguf.Keys.Rope.DIMENSION_SECTIONS.format(arch=arch))
    assert sections == ([*text.rope_parameters["mrope_section"], 0] if family in QWEN else None)
    weights = tensors(reader)
    language = "model.text_model." if family == "idefics3" else "model.language_model."
    np.testing.assert_array_equal(weights[name(_V.TOKEN_EMBD)],
                                  model.state_dict()[language + "embed_tokens.weight"].numpy())
    assert not any(k.startswith(("v.", "mm.")) for k in weights)
    per_layer = 12 if family in QWEN else 13 if family == "gemma3" else 9  # q/k/v biases; Gemma's norms
    tied = family == "gemma3"
    assert len(weights) == per_layer * text.num_hidden_layers + 2 + (not tied)  # embeddings, final norm, head


def test_other_vision_models_adapters_and_k_quants_are_refused_in_one_line(vlm_dirs, tmp_path):
    llava = tmp_path / "llava"
    llava.mkdir()
    (llava / "config.json").write_text(json.dumps({"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
                                                   "vision_config": {"model_type": "clip_vision_model"}}))
    (llava / "preprocessor_config.json").write_text("{}")
    out = str(tmp_path / "m.gguf")
    for folder, model_type in ((str(llava), "llava"), (vlm_dirs["idefics3"], "idefics3")):
        with pytest.raises(ConfigError, match=r"^GGUF export of a vision-language model writes qwen2_vl, qwen2_5_vl, "
                                              r"gemma3 \(the "
                                              rf"text model and llama.cpp's mmproj file\); this one is {model_type}: "):
            export(["--model_name_or_path", folder, "--output_file", out])
    with pytest.raises(ConfigError, match=r"^--adapter_only and the k-quants .* are not built for vision-language"):
        export(["--model_name_or_path", vlm_dirs["qwen2_vl"], "--output_file", out, "--dtype", "q4_k_m"])


def test_an_existing_mmproj_file_is_not_replaced_unless_asked(vlm_dirs, tmp_path):
    (tmp_path / "mmproj-m.gguf").write_bytes(b"not ours")
    with pytest.raises(PathError, match=r"mmproj-m.gguf exists: choose another --output_file, or pass "
                                        r"--overwrite_output_file"):
        export(["--model_name_or_path", vlm_dirs["gemma3"], "--output_file", str(tmp_path / "m.gguf")])


def test_a_tower_activation_llama_cpp_does_not_compute_is_refused(vlm_dirs):
    from tunesmith.export.gguf_vision import projector

    config = copy.deepcopy(load(vlm_dirs["qwen2_vl"])[0].config)
    config.vision_config.hidden_act = "silu"
    with pytest.raises(ConfigError, match=r"writes qwen2_vl vision towers with hidden_act quick_gelu \(llama.cpp's "
                                          r"graph for it\); this one has silu"):
        projector(config)


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("window_size", 56, r"llama.cpp's Qwen2.5-VL attends in windows of 112 pixels; this model's window_size is 56"),
    ("fullatt_block_indexes", [0], r"fullatt_block_indexes \[0\] \(config.json vision_config\) are not such a "),
])
def test_a_qwen2_5_vl_window_llama_cpp_does_not_compute_is_refused(setting, value, message, vlm_dirs, tmp_path):
    """llama.cpp takes full attention in every n-th block (n = the first full block + 1) and windows of 112 pixels."""
    from tunesmith.export.gguf_vision import PROJECTORS

    config = copy.deepcopy(load(vlm_dirs["qwen2_5_vl"])[0].config)
    setattr(config.vision_config, setting, value)  # [0] with 2 blocks: llama.cpp would make block 1 full too
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "clip")
    with pytest.raises(ConfigError, match=message):
        PROJECTORS["qwen2_5_vl"].metadata(writer, config, None)


def test_the_modelfile_names_the_projector_in_a_second_from_line():
    from tunesmith.export.ollama import OllamaChat, modelfile_text

    text = modelfile_text("m.gguf", OllamaChat("{{ .Prompt }}", None, []), "src", projector_name="mmproj-m.gguf")
    assert text.splitlines()[1:3] == ["FROM ./m.gguf", "FROM ./mmproj-m.gguf"]


def test_require_llama_cpp_check_stops_before_loading_where_mtmd_is_missing(vlm_dirs, tmp_path, monkeypatch):
    from tunesmith.export import rules

    monkeypatch.setattr(rules, "llama_cpp_available", lambda: True)  # the mtmd row, with or without llama-cpp-python
    monkeypatch.setattr(rules, "mtmd_library_found", lambda: False)
    with pytest.raises(ConfigError, match=r"^--require_llama_cpp_check: llama-cpp-python was built without its "
                                          r"multimodal library \(mtmd\), so the mmproj file cannot be checked"):
        export(["--model_name_or_path", vlm_dirs["qwen2_vl"], "--output_file", str(tmp_path / "m.gguf"),
                "--require_llama_cpp_check"])


# -- in llama.cpp's multimodal library
def needs_mtmd(test):
    """Opt-in as the other llama.cpp tests (marker llama_cpp: bash scripts/test.sh --with-llama-cpp), and skipped
    where llama-cpp-python has no mtmd."""
    return pytest.mark.llama_cpp(pytest.mark.skipif(
        not mtmd_available(), reason="llama-cpp-python without its multimodal library (mtmd): "
        "bash scripts/setup_llama_cpp.sh builds it with one")(test))


def _picture_check(model, tokenizer, text_path: str, mmproj: str):
    from tunesmith.constants import USER
    from tunesmith.data.images import image_part
    from tunesmith.data.template import encode_prompt, render_text
    from tunesmith.export.gguf_mtmd import check_image_in_llama_cpp, greedy_reply
    from tunesmith.export.vision_export import QUESTION, _data_url, _image_token_id, check_picture

    picture = check_picture(model.config)
    conversation = [{"role": USER, "content": [image_part(_data_url(picture)), {"type": "text", "text": QUESTION}]}]
    prompt = encode_prompt(tokenizer, conversation)
    reply, logits = greedy_reply(model, list(prompt), prompt.vision, 12)
    return check_image_in_llama_cpp(text_path, mmproj, model, tokenizer,
                                    render_text(tokenizer, conversation, add_generation_prompt=True),
                                    _image_token_id(model), list(prompt), prompt.vision, picture, reply, logits)


@needs_mtmd
@pytest.mark.parametrize("family", EXPORTABLE_VISION_TYPES)
def test_llama_cpp_sees_the_picture_as_transformers_does_and_gives_its_reply(family, vlm_dirs, written):
    model, tokenizer = load(vlm_dirs[family])
    check = _picture_check(model, tokenizer, *written[family])
    assert check.layout_equal, check.layout_difference
    # f32 files: ggml's convolution rounds the pixels to f16 (measured 4.0e-4 of the largest feature for Qwen2-VL,
    # 6.2e-4 for Gemma 3); 1e-3 is far below what a wrong weight gives (test_a_projector_from_other_weights_is_caught:
    # order 1). Logits: llama.cpp keeps K and V in f16 (measured 0.14 of 7.9 and 0.003 of 10.1).
    assert check.embd_relative_diff < 1e-3
    assert check.decisive_disagreements == 0 and check.steps == 12, check.first_disagreement
    assert check.logit_max_abs_diff < 0.05 * check.logit_scale


@needs_mtmd
def test_a_projector_from_other_weights_is_caught(vlm_dirs, written, tmp_path, default_model_path):
    from tunesmith.export.vision_export import IMAGE_EMBD_TOLERANCES, _image_refusal

    model, tokenizer = load(vlm_dirs["qwen2_vl"])
    other, _ = load(build_vlm_dir("qwen2_vl", tmp_path / "other", default_model_path, seed=2))
    write_vision_gguf(other, tokenizer, processor_of(tokenizer).image_processor, str(tmp_path / "t.gguf"),
                      str(tmp_path / "p.gguf"), "f32", "other")
    check = _picture_check(model, tokenizer, written["qwen2_vl"][0], str(tmp_path / "p.gguf"))
    assert check.embd_relative_diff > 0.1
    assert "image embeddings differ from transformers'" in _image_refusal(check, IMAGE_EMBD_TOLERANCES["f32"])


@needs_mtmd
def test_export_writes_and_checks_the_text_model_and_its_mmproj_file(vlm_dirs, tmp_path, capsys):
    result = export(["--model_name_or_path", vlm_dirs["qwen2_vl"], "--output_file", str(tmp_path / "q.gguf"),
                     "--dtype", "f16"])
    assert Path(result.output_file).is_file() and Path(result.mmproj_file).name == "mmproj-q.gguf"
    assert result.image.layout_equal and result.image.decisive_disagreements == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mmproj-q.gguf", "q.Modelfile", "q.gguf"]
    out = capsys.readouterr().out
    assert "with the mmproj file, one picture (12 image tokens, prompt laid out as transformers')" in out
    assert "llama-mtmd-cli -m " in out and "--mmproj " in out
    assert "FROM ./mmproj-q.gguf" in Path(result.modelfile).read_text()

