"""A vision-language model as llama.cpp runs one: its language model as a text GGUF (gguf_model's writer, with the
architecture gguf_arch.LANGUAGE_MODELS gives it) and its vision tower with the projector as a second GGUF, the
"mmproj" file llama.cpp's multimodal library (mtmd) loads beside it (`llama-mtmd-cli -m M.gguf --mmproj P.gguf`,
`llama-server ... --mmproj P.gguf`).

The mmproj file follows llama.cpp's own converter (convert_hf_to_gguf.py; conversion/base.py MmprojModel,
qwenvl.py Qwen2VLVisionModel, gemma.py Gemma3VisionModel, smolvlm.py SmolVLMModel, at the commit llama-cpp-python
0.3.36 vendors): architecture `clip`, general.type mmproj, the `clip.*` keys written through the gguf package's
writer (gguf.Keys.Clip / ClipVision), tensor names from gguf.TensorNameMap(MODEL_ARCH.MMPROJ, blocks), and the same
reshaping:
- Qwen2-VL: the fused qkv of each block split into q, k and v; the 3D patch embedding (two frames of a picture) split
  into two 2D ones (`v.patch_embd.weight` and `.weight.1`, which llama.cpp adds up for a still picture);
  projector `qwen2vl_merger`; the tower's quick_gelu is llama.cpp's default activation.
- Qwen2.5-VL: the same reshaping; projector `qwen2.5vl_merger`, SiLU (gated MLP, RMSNorm), and the window-attention
  pattern (`clip.vision.n_wa_pattern`: full attention every n-th block, windows of 112 pixels).
- Gemma 3: SigLIP tower plus projector `gemma3` (its RMSNorm's weight + 1, as in the text model); the tower's unused
  pooling head is left out; the input projection stays f16 (the converter's choice, llama.cpp issue 13025).
- Idefics3 / SmolVLM: SigLIP tower plus projector `idefics3`, its pixel-shuffle scale factor and the image
  processor's longest edge.
Matrices are f16 (f32 for --dtype f32): llama.cpp's converter and the ggml-org releases ship mmproj files in f16,
and the tower is small beside the language model.

The file is named mmproj-<name>.gguf beside <name>.gguf (ExportArguments.mmproj_file), as llama.cpp's converter
names one and as the hub's GGUF repositories ship them: LM Studio and llama-server's -hf pick a projector out of a
folder by that prefix.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
import torch

from ..errors import ConfigError, ExportError
from ..families import FAMILIES, types_where
from ..utils.config_facts import config_fact, text_config
from .gguf_arch import LANGUAGE_MODELS, Architecture
from .gguf_model import FILE_TYPES, add_tensor, gguf_file, write_gguf

_T = gguf.GGMLQuantizationType


class LanguageModel:
    """The language model of a vision-language model as gguf_model's writer takes a causal LM: the text config
    (with the VLM's tie_word_embeddings, which transformers keeps at the top) and the weights under a causal LM's
    names (model.layers..., lm_head), the vision tower and projector left out."""

    def __init__(self, model: Any, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        model_type = model.config.model_type
        self.gguf_architecture: Architecture = LANGUAGE_MODELS[model_type]
        self.display_name = f"{type(model).__name__}'s language model"
        self.config = copy.deepcopy(text_config(model.config))
        self.config.tie_word_embeddings = bool(config_fact(model.config, "tie_word_embeddings", False))
        prefix = FAMILIES[model_type].vision.language + "."
        tensors = model.state_dict() if state_dict is None else state_dict
        self._tensors = {("model." + k[len(prefix):] if k.startswith(prefix) else k): v for k, v in tensors.items()
                         if k.startswith(prefix) or k.startswith("lm_head.")}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._tensors


@dataclass(frozen=True)
class VisionSize:
    """The tower's shape as llama.cpp's clip loader reads it (clip.vision.*)."""

    width: int
    feed_forward: int
    blocks: int
    heads: int
    image_size: int
    patch_size: int
    layer_norm_eps: float


@dataclass(frozen=True)
class Projector:
    """How one family's tower and projector become llama.cpp's mmproj file."""

    projector: str  # gguf.VisionProjectorType
    activation: str  # the tower's hidden_act; llama.cpp computes gelu_quick by default, tanh-gelu with use_gelu
    size: Callable[[Any], VisionSize]  # from the vision config
    renames: tuple[tuple[str, str], ...]  # in-memory name prefix -> the checkpoint name gguf's TensorNameMap knows
    metadata: Callable[[gguf.GGUFWriter, Any, Any], None]  # (writer, VLM config, image processor)
    reshape: Callable[[str, torch.Tensor], Iterator[tuple[str, torch.Tensor]]] | None = None
    skip: tuple[str, ...] = ()  # tensors the model has and llama.cpp's graph does not use
    f16_always: tuple[str, ...] = ()  # name parts kept f16 whatever the dtype
    f32_always: tuple[str, ...] = ()  # name parts kept f32 whatever the dtype


def _qwen2_vl_size(v: Any) -> VisionSize:
    # embed_dim is the tower's width; the config's hidden_size is the merger's output (the text model's width).
    # 560 and 1e-6: the converter's image_size default and the eps transformers' Qwen2-VL tower hard-codes.
    return VisionSize(v.embed_dim, int(v.embed_dim * v.mlp_ratio), v.depth, v.num_heads,
                      getattr(v, "image_size", 560), v.patch_size, 1e-6)


def _qwen2_5_vl_size(v: Any) -> VisionSize:
    # hidden_size is the tower's width here (out_hidden_size the merger's output); RMSNorm's eps as for Qwen2-VL
    return VisionSize(v.hidden_size, v.intermediate_size, v.depth, v.num_heads, getattr(v, "image_size", 560),
                      v.patch_size, 1e-6)


def _siglip_size(v: Any) -> VisionSize:
    return VisionSize(v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads, v.image_size,
                      v.patch_size, v.layer_norm_eps)


def _qwen2_vl_metadata(writer: gguf.GGUFWriter, config: Any, image_processor: Any) -> None:
    v = config.vision_config
    if v.temporal_patch_size != 2:  # llama.cpp adds up exactly two 2D patch embeddings
        raise ConfigError(f"export_gguf: llama.cpp's Qwen2-VL takes temporal_patch_size 2; this model has "
                          f"{v.temporal_patch_size} (config.json vision_config)")
    writer.add_vision_spatial_merge_size(v.spatial_merge_size)


def _qwen2_vl_reshape(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The fused qkv into q, k and v; the Conv3D patch embedding into its two frames' Conv2Ds, named as
    llama.cpp's clip loader looks them up."""
    if ".qkv." in name:
        for part, chunk in zip("qkv", tensor.chunk(3, dim=0)):
            yield name.replace(".qkv.", f".{part}."), chunk
    elif "patch_embed.proj.weight" in name:
        base = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".weight"
        yield base, tensor[:, :, 0]
        yield base + ".1", tensor[:, :, 1]
    else:
        yield name, tensor


# llama.cpp's qwen2.5vl graph cuts the patch grid into windows of this many pixels a side (clip.cpp: an
# attn_window_size it does not read for this projector falls back to 112, the released models' window_size)
QWEN2_5_VL_WINDOW = 112


def _qwen2_5_vl_metadata(writer: gguf.GGUFWriter, config: Any, image_processor: Any) -> None:
    """Qwen2-VL's keys, SiLU, and the window-attention pattern: every n-th block attends over the whole picture."""
    _qwen2_vl_metadata(writer, config, image_processor)
    v = config.vision_config
    if v.window_size != QWEN2_5_VL_WINDOW:
        raise ConfigError(f"export_gguf: llama.cpp's Qwen2.5-VL attends in windows of {QWEN2_5_VL_WINDOW} pixels; "
                          f"this model's window_size is {v.window_size} (config.json vision_config)")
    full = list(v.fullatt_block_indexes)
    pattern = full[0] + 1 if full else 0
    if not full or full != list(range(pattern - 1, v.depth, pattern)):  # llama.cpp: block i full when (i+1) % n == 0
        raise ConfigError(f"export_gguf: llama.cpp's Qwen2.5-VL takes full attention in every n-th block; this "
                          f"model's fullatt_block_indexes {full} (config.json vision_config) are not such a pattern")
    writer.add_vision_use_silu(True)
    writer.add_vision_n_wa_pattern(pattern)


def _gemma3_metadata(writer: gguf.GGUFWriter, config: Any, image_processor: Any) -> None:
    writer.add_vision_use_gelu(True)
    v = config.vision_config
    # llama.cpp pools the patch grid by 4 per side unless told otherwise (the real models' 64 -> 16)
    scale = (v.image_size // v.patch_size) // int(config.mm_tokens_per_image ** 0.5)
    if scale > 0 and scale != 4:
        writer.add_vision_projector_scale_factor(scale)


def _gemma3_reshape(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    name = name.replace("_weight", ".weight")  # mm_input_projection_weight is a bare parameter
    yield name, tensor + 1 if "soft_emb_norm.weight" in name else tensor  # Gemma's RMSNorm scales by 1 + w


def _idefics3_metadata(writer: gguf.GGUFWriter, config: Any, image_processor: Any) -> None:
    writer.add_vision_projector_scale_factor(config.scale_factor)
    writer.add_vision_use_gelu(True)
    writer.add_vision_preproc_image_size(image_processor.size["longest_edge"])


# How each of llama.cpp's projector types is written (the one a family's mmproj file uses is its registry entry's,
# families.Family.mmproj_projector).
_WRITERS: tuple[Projector, ...] = (
    Projector(gguf.VisionProjectorType.QWEN2VL, "quick_gelu", _qwen2_vl_size,
              (("model.visual.", "visual."),), _qwen2_vl_metadata, _qwen2_vl_reshape,
              f32_always=(".position_embd.",)),
    Projector(gguf.VisionProjectorType.QWEN25VL, "silu", _qwen2_5_vl_size,
              (("model.visual.", "visual."),), _qwen2_5_vl_metadata, _qwen2_vl_reshape,
              f32_always=(".position_embd.",)),
    Projector(gguf.VisionProjectorType.GEMMA3, "gelu_pytorch_tanh", _siglip_size,
              (("model.vision_tower.", "vision_tower.vision_model."),
               ("model.multi_modal_projector.", "multi_modal_projector.")),
              _gemma3_metadata, _gemma3_reshape, skip=("vision_tower.vision_model.head.",),
              f16_always=("input_projection",), f32_always=(".embeddings.",)),
    Projector(gguf.VisionProjectorType.IDEFICS3, "gelu_pytorch_tanh", _siglip_size,
              (("model.vision_model.", "model.vision_model."), ("model.connector.", "model.connector.")),
              _idefics3_metadata, f32_always=(".embeddings.",)),
)
# The projector of each vision-language model whose mmproj file is written, by model_type.
PROJECTORS: dict[str, Projector] = {t: w for w in _WRITERS for t in types_where("mmproj_projector")
                                    if FAMILIES[t].mmproj_projector == w.projector}
# Which of these are exported (Idefics3's files are written but not exported, and why): the registry's gguf_exported.


def projector(config: Any) -> Projector:
    """The family's Projector, or a ConfigError naming the exportable types and any setting llama.cpp's graph for
    it does not compute."""
    spec = PROJECTORS.get(config.model_type)
    if spec is None:
        raise ConfigError(f"export_gguf writes vision-language models of types {', '.join(PROJECTORS)} (a text GGUF "
                          f"and its mmproj file); this one is {config.model_type}")
    activation = config.vision_config.hidden_act
    if activation != spec.activation:
        raise ConfigError(f"export_gguf writes {config.model_type} vision towers with hidden_act {spec.activation} "
                          f"(llama.cpp's graph for it); this one has {activation}")
    return spec


def _checkpoint_name(spec: Projector, name: str) -> str | None:
    for prefix, replacement in spec.renames:
        if name.startswith(prefix):
            return replacement + name[len(prefix):]
    return None


def mmproj_tensors(model: Any, spec: Projector, state_dict: dict[str, torch.Tensor] | None = None,
                   ) -> Iterator[tuple[str, str, np.ndarray]]:
    """(checkpoint name, GGUF name, float32 array in PyTorch's layout) of every tower and projector weight llama.cpp
    uses."""
    # at least 3 "blocks": the map numbers the projector's layers (Qwen2-VL's merger.mlp.0 and .2) as blocks too
    names = gguf.TensorNameMap(gguf.MODEL_ARCH.MMPROJ, max(spec.size(model.config.vision_config).blocks, 3))
    for hf_name, tensor in (model.state_dict() if state_dict is None else state_dict).items():
        name = _checkpoint_name(spec, hf_name)
        if name is None or any(name.startswith(s) for s in spec.skip):
            continue
        for part, data in (spec.reshape(name, tensor) if spec.reshape else [(name, tensor)]):
            gguf_name = part if part.startswith("v.") else names.get_name(part, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise ExportError(f"no mmproj tensor name for {hf_name} in llama.cpp's {spec.projector} projector")
            yield name, gguf_name, data.detach().to(torch.float32).cpu().numpy()


def _mmproj_tensor_type(spec: Projector, names: tuple[str, str], array: np.ndarray, dtype: str
                        ) -> gguf.GGMLQuantizationType:
    """As the converter's tensor_force_quant decides, on the checkpoint's name or the GGUF one (`names`)."""
    if array.ndim == 1 or any(part in name for part in spec.f32_always for name in names):
        return _T.F32
    if any(part in name for part in spec.f16_always for name in names):
        return _T.F16
    return _T.F32 if dtype == "f32" else _T.F16


def write_mmproj(model: Any, image_processor: Any, path: str, dtype: str, name: str,
                 state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """Write the vision tower and projector of `model` (a PROJECTORS type) as llama.cpp's mmproj GGUF."""
    spec = projector(model.config)
    size = spec.size(model.config.vision_config)
    arch_name = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ]
    with gguf_file(path, arch_name, gguf.GGUFType.MMPROJ, name) as writer:
        writer.add_file_type(FILE_TYPES["f32" if dtype == "f32" else "f16"])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_clip_has_vision_encoder(True)
        writer.add_clip_projector_type(spec.projector)
        writer.add_vision_projection_dim(config_fact(model.config, "hidden_size"))
        writer.add_vision_image_size(size.image_size)
        writer.add_vision_patch_size(size.patch_size)
        writer.add_vision_embedding_length(size.width)
        writer.add_vision_feed_forward_length(size.feed_forward)
        writer.add_vision_block_count(size.blocks)
        writer.add_vision_head_count(size.heads)
        writer.add_vision_attention_layernorm_eps(size.layer_norm_eps)
        writer.add_vision_image_mean(list(image_processor.image_mean))
        writer.add_vision_image_std(list(image_processor.image_std))
        spec.metadata(writer, model.config, image_processor)
        for source_name, tensor_name, array in mmproj_tensors(model, spec, state_dict):
            qtype = _mmproj_tensor_type(spec, (source_name, tensor_name), array, dtype)
            add_tensor(writer, tensor_name, array, qtype)


def write_vision_gguf(model: Any, tokenizer: Any, image_processor: Any, text_path: str, projector_path: str,
                      dtype: str, name: str, extra_metadata: dict[str, str] | None = None,
                      drop_sliding_window: bool = False) -> None:
    """The language model of `model` as a text GGUF at `text_path` and its tower + projector as the mmproj GGUF at
    `projector_path`."""
    projector(model.config)  # refused before anything is written
    write_gguf(LanguageModel(model), tokenizer, text_path, dtype, name, extra_metadata,
               drop_sliding_window=drop_sliding_window)
    write_mmproj(model, image_processor, projector_path, dtype, name)
