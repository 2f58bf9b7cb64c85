"""The settings of the runs that use a trained model rather than train one: score and inspect (the features'
own are in their folders: tunesmith/export/args.py, merge/args.py, evaluation/args.py, rl/args.py). Models,
adapters and data come from the shared dataclasses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class ScoreArguments:
    role: ClassVar[str] = "score"
    _argument_group_name: ClassVar[str] = "scoring"

    output_file: str | None = field(
        default=None, metadata={"help": "Where to write one JSON line of scores per input row."}
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass."})


@dataclass
class InspectArguments:
    role: ClassVar[str] = "inspect"
    _argument_group_name: ClassVar[str] = "inspect"

    output_file: str | None = field(default=None, metadata={"help": "Write input_ids/labels per input row here."})
    show: int = field(default=5, metadata={"help": "How many examples to print (0: none, -1: all)."})
    color: str = field(default="auto", metadata={"help": "auto (when stdout is a terminal), always, never."})
    seed: int = field(default=42, metadata={"help": "The --seed of the training run to inspect: with --data_split or "
                                            "--data_weights, it chooses the same rows as that run."})
    text_column: str = field(
        default="text", metadata={"help": "A text corpus (continued pre-training, `tunesmith pt`): the field of its "
                                  "rows that holds the document, as pt's --text_column."})
    document_separator: str = field(
        default="file", metadata={"help": "A text corpus: how its .txt files are cut into documents, as pt's "
                                  "--document_separator (file, blank_line, or a separator line)."})


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass
class UIArguments:
    """`tunesmith ui`: a web page that runs the same commands as the CLI, each as its own process."""

    role: ClassVar[str] = "ui"
    _argument_group_name: ClassVar[str] = "web UI"

    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on. Anything but this machine "
                                                     "(127.0.0.1, localhost, ::1) needs --auth."})
    port: int = field(default=7860, metadata={"help": "TCP port to listen on."})
    root: str = field(default="outputs", metadata={"help": "The folder of runs: new runs go under it, the Runs tab "
                                                   "lists it, and every path the page takes is confined to it and "
                                                   "to the --data_dir folders."})
    data_dir: list[str] = field(
        default_factory=lambda: ["data", "configs"],
        metadata={"nargs": "+", "help": "Folders the page may read data files, run configs and models from (besides "
                  "--root and the embedded default model)."})
    allow_code: bool = field(
        default=False, metadata={"help": "Let runs started from the page run code that is not tunesmith's: "
                                 "--trust_remote_code (a model's own Python) and functions named "
                                 "package.module:function (--reward_funcs, --tool_funcs), from the Advanced flags or a "
                                 "Run config. Without it the page refuses them in one line. Paths stay confined either "
                                 "way."})
    auth: str | None = field(
        default=None, metadata={"help": "user:password asked by the page (required with a --host other than this "
                                "machine's; default: the TUNESMITH_UI_AUTH environment variable when set)."})

    def __post_init__(self) -> None:
        if self.auth is None:
            self.auth = os.environ.get("TUNESMITH_UI_AUTH") or None

    @property
    def credentials(self) -> tuple[str, str] | None:
        if not self.auth:
            return None
        user, _, password = self.auth.partition(":")
        return user, password
