"""Console-script entry points (`tunesmith-sft`, ...): each runs the same recipe as the stage script."""

from __future__ import annotations

import importlib


def _run(module: str) -> None:
    importlib.import_module(module).main()


def sft_main() -> None:
    _run("tunesmith.recipes.sft")


def reward_main() -> None:
    _run("tunesmith.recipes.reward")


def ppo_main() -> None:
    _run("tunesmith.recipes.ppo")


def merge_main() -> None:
    _run("tunesmith.recipes.merge")


def chat_main() -> None:
    _run("tunesmith.chat.cli")
