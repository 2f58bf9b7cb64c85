"""Attention for padding-free packed rows (data/packing.py): each example of a row attends only within itself, and
exactly as the model's own attention does on that example alone, whatever the architecture adds to plain causal
attention: a sliding window (per layer, as the model passes it), logit soft-capping (Gemma 2), attention sinks
(gpt-oss), its own scaling. A packed row then costs the sum of its examples' attention, not the square of its length.

Two implementations are registered with transformers: `sdpa_varlen` for models on sdpa, `eager_varlen` for models
that have only eager attention (Gemma 2, gpt-oss). Anything that is not a packed row (padded batches, generation)
goes to transformers' sdpa, or to the model's own eager function, unchanged. A packed row runs on the kernel
`packed_kernel` picks, in this one place:

- FLASH_VARLEN: on CUDA in half precision (float32 inputs under autocast included), torch's own flash-attention
  varlen kernel (the one behind its nested-tensor SDPA), one call for the whole row from `cu_seq_lens_q`, with
  `max_length_q` from the collator (no host-device synchronisation) and the window as `window_size_left`; no
  flash-attn package needed;
- SDPA_PER_EXAMPLE: elsewhere (CPU, float32), torch's SDPA once per example, causal, or with an explicit
  causal-window mask for an example longer than the window: a Python loop whose per-call overhead is small next
  to a CPU's maths (docs/benchmark.md) but which leaves a GPU waiting on the host;
- EAGER_PER_EXAMPLE: where neither kernel computes what the model does (soft-caps, sinks), the model's own
  `eager_attention_forward` once per example with its causal(-window) mask: the model's code, so exact by
  construction.

Exact or refused: an argument the model passes to its attention function that no kernel here implements stops the
run with one line (a new transformers feature then fails a test instead of training a different model); each layer
checks, whenever a packed row holds a longer example than it has checked before, that the mask the model built
agrees inside every example with the one the kernel applies (a window or pattern the model keeps in its mask only
would otherwise be dropped); and a model with layers that are not attention (linear attention, Mamba) is refused,
since they carry a state from one packed conversation into the next. The examples'
boundaries come from the collator's `cu_seq_lens_q`, never from transformers detecting packed rows in the position
ids: gpt-oss builds no block mask from them.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..utils.config_facts import text_config

logger = logging.getLogger(__name__)

VARLEN_SDPA, VARLEN_EAGER = "sdpa_varlen", "eager_varlen"
FLASH_VARLEN = "torch flash-attention varlen kernel (one call per row)"
SDPA_PER_EXAMPLE = "SDPA per example"
EAGER_PER_EXAMPLE = "the model's own eager attention per example"
# What transformers' decoders pass to an attention function beside the attention's own arguments: the packed row's
# boundaries (read here), and batch bookkeeping for the loss and outputs that does not change attention's maths.
# Anything else with a value is refused (see `_refuse_unknown`).
_BOOKKEEPING = frozenset({
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "position_ids", "seq_idx", "num_items_in_batch",
    "shift_labels", "output_attentions", "output_hidden_states", "output_router_logits", "use_cache", "return_dict",
    "cache_position", "token_type_ids",
})
_reported: set[str] = set()
# Per layer, the longest example whose mask has been checked (`_check_model_mask`).
_mask_checked: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()


def attention_dtype(query: torch.Tensor) -> torch.dtype:
    """The precision attention computes in: under CUDA autocast, float32 inputs go to the autocast dtype, as
    torch's SDPA casts them there (a QLoRA model's 4-bit layers return float32, and its upcast norms keep the
    residual stream there); otherwise the inputs' own."""
    if query.is_cuda and query.dtype == torch.float32 and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    return query.dtype


def _flash_takes_windows() -> bool:
    return "window_size_left" in str(torch.ops.aten._flash_attention_forward.default._schema)


def packed_kernel(query: torch.Tensor, key: torch.Tensor, window: int | None = None, softcap: float | None = None,
                  sinks: torch.Tensor | None = None) -> str:
    """The kernel a packed row's attention runs on. Soft-capped logits and sinks: EAGER_PER_EXAMPLE (neither torch
    kernel takes them). Else FLASH_VARLEN where torch's flash kernel takes these tensors (CUDA, float16/bfloat16
    inputs or autocast to them, head size a multiple of 8 up to 256, heads a multiple of the key's, and a window
    argument when there is a window), else SDPA_PER_EXAMPLE."""
    if softcap is not None or sinks is not None:
        return EAGER_PER_EXAMPLE
    head_dim = query.shape[-1]
    fits = (query.is_cuda and attention_dtype(query) in (torch.float16, torch.bfloat16) and key.dtype == query.dtype
            and head_dim % 8 == 0 and head_dim <= 256 and query.shape[1] % key.shape[1] == 0
            and torch.backends.cuda.is_flash_attention_available() and torch.backends.cuda.flash_sdp_enabled()
            and (window is None or _flash_takes_windows()))
    return FLASH_VARLEN if fits else SDPA_PER_EXAMPLE


def flash_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor,
                 max_length: int, dropout: float, scaling: float | None, window: int | None = None) -> torch.Tensor:
    """Causal attention within each example of one packed row, [1, heads, tokens, dim] in (grouped key/value
    heads as they are), [1, tokens, heads, dim] out. torch's kernel takes [tokens, heads, dim] and the
    examples' cumulative lengths (int32), as flash-attn's flash_attn_varlen_func does; autograd has its
    backward. A window of w tokens (the query and the w - 1 before it, as transformers' masks count) is
    window_size_left w - 1."""
    dtype = attention_dtype(query)
    q, k, v = (t[0].transpose(0, 1).to(dtype).contiguous() for t in (query, key, value))
    cu = cu_seq_lens.to(device=q.device, dtype=torch.int32)
    windows = {} if window is None or window >= max_length else {"window_size_left": window - 1,
                                                                 "window_size_right": 0}
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_length, max_length, dropout, True, False,
                                                  scale=scaling, **windows)[0]
    return out.unsqueeze(0)


def example_mask(length: int, window: int | None, device: torch.device) -> torch.Tensor:
    """[length, length] bool, True where a query (row) attends to a key (column) of the same example: causal, and
    within the window when there is one (key > query - window, transformers' sliding_window_overlay)."""
    position = torch.arange(length, device=device)
    distance = position[:, None] - position[None, :]
    allowed = distance >= 0
    return allowed & (distance < window) if window is not None else allowed


def _eager_function(module: nn.Module) -> Callable:
    """The eager attention function of the model's own modeling file (each architecture has its own: Gemma 2's
    soft-caps, gpt-oss's sinks)."""
    function = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if function is None:
        raise ConfigError(f"packed attention: {type(module).__name__} has no eager_attention_forward in its modeling "
                          "file to compute it exactly; train with --packing false")
    return function


def _per_example(kernel: str, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 bounds: list[int], window: int | None, dropout: float, scaling: float | None,
                 attention_args: dict[str, Any]) -> torch.Tensor:
    """Each example [s, e) of the row on its own through SDPA (masked only when longer than the window) or the model's
    eager function (always masked: eager takes no is_causal); outputs [1, tokens, heads, dim] concatenated."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    eager = _eager_function(module) if kernel == EAGER_PER_EXAMPLE else None
    outputs = []
    for s, e in zip(bounds[:-1], bounds[1:]):
        q, k, v = query[:, :, s:e], key[:, :, s:e], value[:, :, s:e]
        if eager is not None:
            allowed = example_mask(e - s, window, query.device)
            mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
            mask = mask.masked_fill(~allowed, torch.finfo(query.dtype).min)[None, None]
            out = eager(module, q, k, v, mask, dropout=dropout, scaling=scaling, **attention_args)[0]
        elif window is not None and e - s > window:
            # torch's SDPA takes the grouped key/value heads as they are; transformers' copies them when given a
            # mask (4-10% of a windowed layer's attention on CPU, benchmarks/attention.py)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=example_mask(e - s, window, query.device), dropout_p=dropout, scale=scaling,
                enable_gqa=q.shape[1] != k.shape[1]).transpose(1, 2)
        else:
            out = sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True)[0]
        outputs.append(out)
    return torch.cat(outputs, dim=1)


def _refuse_unknown(module: nn.Module, kwargs: dict[str, Any]) -> None:
    """Stops on an argument with a value that no packed kernel implements (is_causal=False: bidirectional layers)."""
    unknown = sorted(name for name, value in kwargs.items()
                     if value is not None and name not in _BOOKKEEPING and name != "is_causal")
    if kwargs.get("is_causal") is False:
        unknown.append("is_causal=False")
    if unknown:
        raise ConfigError(f"packed attention: {type(module).__name__} passes {', '.join(unknown)} to its attention "
                          "function, which tunesmith's packed kernels do not implement; train with --packing false "
                          "(padded rows, the model's own attention)")


def _needs_mask_check(module: nn.Module, attention_mask: torch.Tensor | None, longest: int) -> bool:
    """Whether this row's mask is worth checking: the model built one, and this layer has not yet checked an example
    this long (windows and chunks show only past their size, and a shorter example's block is the top-left corner
    of a longer one's: a layer checks a few times in a run, as its longest example grows)."""
    return (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4
            and longest > _mask_checked.get(module, 0))


def _check_model_mask(module: nn.Module, attention_mask: torch.Tensor, bounds: list[int], longest: int,
                      window: int | None) -> None:
    """Inside every example, the mask the model built for this row allows what the kernel allows. A window, chunk or
    pattern the model applies through its mask alone would differ here."""
    _mask_checked[module] = longest
    allowed = attention_mask[0] if attention_mask.dtype == torch.bool else attention_mask[0] == 0
    for s, e in zip(bounds[:-1], bounds[1:]):
        block = allowed[:, s:e, s:e]
        if block.shape[-1] != e - s:  # a mask of another shape (a cache): nothing to compare
            return
        if not torch.equal(block, example_mask(e - s, window, block.device).expand_as(block)):
            raise ConfigError(f"packed attention: {type(module).__name__}'s own mask differs from causal attention"
                              f"{f' in a window of {window}' if window else ''} inside an example (a "
                              "pattern its attention function is not told of); train with --packing false")


def _report(kernel: str, window: int | None, softcap: float | None, sinks: torch.Tensor | None) -> None:
    features = [f"sliding window {window}" if window else "", f"logit soft-cap {softcap}" if softcap else "",
                "attention sinks" if sinks is not None else ""]
    line = kernel + "".join(f", {f}" for f in features if f)
    if line not in _reported:  # once per process and kind of layer: which kernel a run's packed rows attend with
        _reported.add(line)
        logger.info("packed rows attend with %s", line)


def packed_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    *,
    unpacked: Callable,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each example of a packed row (from `cu_seq_lens_q`) on the kernel `packed_kernel` picks;
    anything else goes to `unpacked` (transformers' sdpa or the model's eager function) with every argument."""
    packed = cu_seq_lens_q is not None and query.shape[0] == 1 and query.shape[2] == key.shape[2] > 1
    bounds = cu_seq_lens_q.tolist() if packed and not query.is_cuda else None
    if not packed or cu_seq_lens_q.numel() < 2 or (bounds is not None and bounds[-1] != query.shape[2]):
        extra = {name: value for name, value in (("sliding_window", sliding_window), ("softcap", softcap),
                                                 ("s_aux", s_aux)) if value is not None}
        return unpacked(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        cu_seq_lens_q=cu_seq_lens_q, max_length_q=max_length_q, **extra, **kwargs)
    _refuse_unknown(module, kwargs)
    if sliding_window is None:  # Qwen2-MoE keeps its sliding layers' window on the module and in its mask only
        sliding_window = getattr(module, "sliding_window", None)
    kernel = packed_kernel(query, key, sliding_window, softcap, s_aux)
    _report(kernel, sliding_window, softcap, s_aux)
    if kernel == FLASH_VARLEN:
        if not isinstance(max_length_q, int):  # the collators give it; a caller without it pays one sync
            max_length_q = int((cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).max())
        if _needs_mask_check(module, attention_mask, max_length_q):  # a synchronisation, a few times a run
            _check_model_mask(module, attention_mask, cu_seq_lens_q.tolist(), max_length_q, sliding_window)
        return flash_varlen(query, key, value, cu_seq_lens_q, max_length_q, dropout, scaling, sliding_window), None
    bounds = bounds if bounds is not None else cu_seq_lens_q.tolist()
    longest = max(b - a for a, b in zip(bounds, bounds[1:]))
    if _needs_mask_check(module, attention_mask, longest):
        _check_model_mask(module, attention_mask, bounds, longest, sliding_window)
    attention_args = {name: value for name, value in (("softcap", softcap), ("s_aux", s_aux)) if value is not None}
    out = _per_example(kernel, module, query, key, value, bounds, sliding_window, dropout, scaling, attention_args)
    return out, None  # [batch, tokens, heads, head_dim], as sdpa and eager return


def sdpa_varlen_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                  attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """`sdpa_varlen`: packed rows as above, everything else through transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return packed_attention_forward(module, query, key, value, attention_mask, unpacked=sdpa_attention_forward,
                                    **kwargs)


def eager_varlen_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                   attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """`eager_varlen`: packed rows as above, everything else through the model's own eager function."""
    return packed_attention_forward(module, query, key, value, attention_mask, unpacked=_eager_function(module),
                                    **kwargs)


def supported_attn_implementations(config: Any, task: str = "causal_lm") -> list[str] | None:
    """The attn_implementations the model class this config loads as takes (eager always; sdpa and flash attention
    where the class says so: Gemma 2 and gpt-oss have no sdpa), or None for a class transformers does not map
    (remote code: the class decides when it loads)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if task == "reward" else AutoModelForCausalLM
    model_class = auto._model_mapping[type(config)] if type(config) in auto._model_mapping else None
    if model_class is None:
        return None
    # gpt-oss lists the flash kernels that implement its sinks; flash-attn 2 is not one (transformers would drop them)
    compatible = getattr(model_class, "_compatible_flash_implementations", None)
    flash = getattr(model_class, "_supports_flash_attn", False) and (compatible is None
                                                                     or "flash_attention_2" in compatible)
    return ["eager"] + (["sdpa"] if model_class._supports_sdpa else []) + (["flash_attention_2"] if flash else [])


def choose_attn_implementation(requested: str, config: Any, task: str = "causal_lm",
                               flash_installed: bool = False) -> str:
    """The attn_implementation a model loads with. auto: flash_attention_2 where flash-attn is installed on CUDA
    and the class takes it, else sdpa where the class takes it, else eager. A named one the class does not take is
    one line naming those it takes."""
    supported = supported_attn_implementations(config, task)
    if requested != "auto":
        if supported is not None and requested not in supported:
            raise ConfigError(f"--attn_implementation {requested}: {config.model_type} models do not support it; "
                              f"use {' or '.join(supported)} (or auto)")
        return requested
    if supported is None:
        return "flash_attention_2" if flash_installed else "sdpa"
    if flash_installed and "flash_attention_2" in supported:
        return "flash_attention_2"
    return "sdpa" if "sdpa" in supported else "eager"


def register_varlen_attention() -> None:
    """Make `sdpa_varlen` and `eager_varlen` valid attn_implementations, masked as sdpa and eager are."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    AttentionInterface.register(VARLEN_SDPA, sdpa_varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_SDPA, sdpa_mask)
    AttentionInterface.register(VARLEN_EAGER, eager_varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN_EAGER, eager_mask)


# Layers that attend (within a window or not); any other kind (linear attention, Mamba, convolutions) carries a
# state along the row, from one packed conversation into the next, which no attention kernel can cut.
ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention"})


def refuse_stateful_layers(config: Any) -> None:
    """One line for a model with layers that are not attention (MiniMax's and Qwen3-Next's linear attention,
    Bamba's Mamba, LFM2's convolutions...): packed rows would leak across conversations there."""
    config = text_config(config)
    layer_kinds = set(getattr(config, "layer_types", None) or ()) | set(getattr(config, "layers_block_type", None) or ())
    others = sorted(layer_kinds - ATTENTION_LAYERS - {"attention"})  # Jamba's block types: "attention" / "mamba"
    if others or "mamba" in config.model_type:
        named = ", ".join(others) or "mamba"
        raise ConfigError(f"--packing: {config.model_type} has {named} layers, which carry a state from one packed "
                          "conversation into the next; train with --packing false")


def use_varlen_attention(model: nn.Module) -> str:
    """Switch a model on sdpa to sdpa_varlen and one on eager to eager_varlen; flash attention (varlen already,
    windows and soft-caps included) stays as it is. Returns the implementation the model now uses. A model whose
    layers are not all attention is refused (`refuse_stateful_layers`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    refuse_stateful_layers(base.config)
    current = base.config._attn_implementation
    varlen = {"sdpa": VARLEN_SDPA, "eager": VARLEN_EAGER}.get(current)
    if varlen is None:
        return current
    register_varlen_attention()
    base.set_attn_implementation(varlen)
    return varlen
