"""Shared fixtures: the real SmolLM2 tokenizer and chat template, tiny random models built from a
config around it (fast tier), and the real 135M default model (slow tier). The plain helpers the tests import
(tiny models, data rows, a served process) live in tests/helpers/."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.helpers.tiny_models import build_tiny_model_dir
from tests.helpers.vlm_models import build_vlm_dir

# Keep tests off any hub, and let the two CI cores run one test's maths without oversubscription.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def no_zero3_loading_left_behind() -> Iterator[None]:
    """transformers' TrainingArguments with a ZeRO-3 config turns ZeRO-3's sharded loading on for the whole process
    (a weak reference that lives as long as the arguments do); a test that parses such a config and fails on purpose
    keeps them alive in its traceback, and every later from_pretrained in the same worker then starts DeepSpeed (no
    launcher here: it looks for MPI and stops). Each test ends with it off."""
    yield
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


@pytest.fixture(scope="session")
def default_model_path() -> str:
    from tunesmith.models.default_model import ensure_default_model

    return str(ensure_default_model())


@pytest.fixture(scope="session")
def tokenizer(default_model_path):
    from tunesmith.hparams import ModelArguments
    from tunesmith.models.loader import load_tokenizer

    return load_tokenizer(ModelArguments(model_name_or_path=default_model_path))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture(scope="session")
def chatty_model_dir(tmp_path_factory, tokenizer) -> str:
    # Larger random weights than the shared tiny model (whose greedy reply is "\n" over and over): replies
    # with varied words, a byte token that never completes a character (decoded as U+FFFD), and
    # multiple-choice answers whose log-likelihoods differ.
    return build_tiny_model_dir(tmp_path_factory.mktemp("chatty"), tokenizer, initializer_range=0.2)


@pytest.fixture(scope="session")
def vlm_dir(tmp_path_factory, default_model_path) -> Callable[..., str]:
    """`vlm_dir(family, seed=0)`: a tiny random vision-language model folder (tests/helpers/vlm_models.py), built
    once per test process for each family and seed and shared by the modules that ask for it (each used to build its
    own: 2-3 s a family on 2 cores). The tests read these folders and never write into them."""
    built: dict[tuple[str, int], str] = {}

    def folder(family: str, seed: int = 0) -> str:
        if (family, seed) not in built:
            built[family, seed] = build_vlm_dir(family, tmp_path_factory.mktemp(f"{family}-seed{seed}"),
                                                default_model_path, seed=seed)
        return built[family, seed]

    return folder
