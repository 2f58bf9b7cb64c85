"""What the page's buttons do, without the page: build and show a command line, start, follow and stop a
training run, list runs, preview a dataset, chat, evaluate and export. Every run is a `tunesmith <stage>`
process (ui/jobs.py), so the page adds no second implementation of a stage; app.py only wires these to
Gradio components, and the functional tests call them directly."""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..data.inspect import PLAIN_OFF, PLAIN_ON, highlight_trained, inspect_rows
from ..errors import ConfigError, PathError, UserError
from ..hparams import GenerationArguments, ModelArguments, SFTDataArguments
from ..models.default_model import DEFAULT_MODEL_NAME, default_model_dir
from ..models.loader import load_tokenizer
from . import runs as runs_mod
from .chat import ModelCache, session, stream_reply
from .command_lines import MERGE_METHODS, Confinement, TrainForm, shown, train_flags, tunesmith_argv
from .jobs import Job, tail
from .run_limits import check_run

PREVIEW_ROWS = 3
DEMO_CONFIG = os.path.join("configs", "sft_lora_demo.yaml")
SHIPPED_TASKS = ("tunesmith_identity", "tunesmith_arithmetic", "tunesmith_tool_calls", "tunesmith_knowledge")


class Workbench:
    """The state behind one page: its folders, its jobs (one per kind: train, eval, export) and its
    loaded chat models."""

    def __init__(self, root: str, data_dirs: list[str] | tuple[str, ...] = (), allow_code: bool = False,
                 uploads: str | None = None) -> None:
        """allow_code: runs may import code (`tunesmith ui --allow_code`); uploads: the folder where the page keeps
        the pictures it uploads (Gradio's), read by Chat."""
        os.makedirs(root, exist_ok=True)
        self.root = root
        self.allow_code = allow_code
        self.confinement = Confinement(root, data_dirs, extra=[str(default_model_dir()), *([uploads] if uploads else [])])
        # What a newcomer starts from, where the repo's demo is at hand: the quickstart's run config.
        self.demo_config = DEMO_CONFIG if os.path.isfile(DEMO_CONFIG) and self.allowed(DEMO_CONFIG) else ""
        self.jobs: dict[str, Job] = {}
        self.train_dir: str | None = None
        self.train_max_steps: int | None = None
        self.models = ModelCache()
        self._tokenizers: dict[str | None, Any] = {}

    def allowed(self, path: str) -> bool:
        try:
            self.confinement.check(path)
        except PathError:
            return False
        return True

    # -- Train
    def default_output(self, stage: str) -> str:
        n = 1
        while os.path.exists(os.path.join(self.root, f"{stage}_{n}")):
            n += 1
        return os.path.join(self.root, f"{stage}_{n}")

    def train_argv(self, form: TrainForm) -> list[str]:
        """The argument list of the run the form describes, its paths checked against the allowed folders."""
        if form.model and form.model.strip():
            self.confinement.check(form.model, "Model")
        if form.config and form.config.strip():
            self.confinement.check(form.config, "Run config")
        if form.dataset and form.dataset.strip():
            self.confinement.check(form.dataset, "Dataset")
        elif not (form.config and form.config.strip()):
            raise PathError("Dataset: empty; give a data file (e.g. data/demo/sft.jsonl), or a Run config that names one")
        output = form.output_dir.strip() if form.output_dir and form.output_dir.strip() else self.default_output(form.stage)
        form = TrainForm(**{**vars(form), "output_dir": self.confinement.under_root(output)})
        command, flags = train_flags(form)
        check_run(command, flags, self.confinement, self.allow_code)  # the Run config's and Advanced flags' values too
        return tunesmith_argv(command, flags)

    def command_line(self, form: TrainForm) -> str:
        """The command line to show (and copy); a form that cannot run shows its one-line error instead."""
        try:
            return shown(self.train_argv(form))
        except UserError as e:
            return f"tunesmith: {e.kind}: {e}"

    def start(self, form: TrainForm) -> str:
        job = self.jobs.get("train")
        if job is not None and job.running:
            return "a run is going already: Stop it first"
        try:
            argv = self.train_argv(form)
        except UserError as e:
            return f"tunesmith: {e.kind}: {e}"
        self.train_dir = argv[argv.index("--output_dir") + 1]
        self.train_max_steps = int(form.max_steps) if form.max_steps else None
        self.jobs["train"] = Job(argv, runs_mod.log_path(self.root, self.train_dir))
        return f"started: {shown(argv)}"

    def stop(self) -> str:
        job = self.jobs.get("train")
        if job is None or not job.running:
            return "nothing running"
        return f"run {job.stop()}; Start again with the same output folder to resume from its last checkpoint"

    def progress(self) -> dict[str, Any]:
        """The running (or last) training run: status, step, total, ETA, the points of its plots, its log and
        the CLI's one-line error if it failed with one."""
        job = self.jobs.get("train")
        if job is None:
            return {"status": "idle", "step": 0, "total": None, "eta": None, "loss": [], "lr": [], "grad_norm": [],
                    "log": "", "error": None}
        rows = runs_mod.read_metrics(self.train_dir) if self.train_dir else []
        step = max((r.get("step", 0) for r in rows), default=0)
        total = self.train_max_steps
        progress = job.events("progress")  # the trainer's step of max_steps (train/callbacks.MetricsFileCallback)
        if progress:
            step, total = max(step, progress[-1]["step"]), progress[-1]["max_steps"] or total
        eta = None
        if total and step and job.running:
            eta = job.elapsed() / step * max(total - step, 0)
        return {"status": job.status(), "step": step, "total": total, "eta": eta,
                "loss": runs_mod.series(rows, ("loss", "eval_loss")),
                "lr": runs_mod.series(rows, ("learning_rate",)), "grad_norm": runs_mod.series(rows, ("grad_norm",)),
                "log": job.log(), "error": job.error()}

    def preview(self, dataset: str, model: str = "", rows: int = PREVIEW_ROWS) -> tuple[str, str]:
        """(HTML of the first rows rendered with the chat template, the trained text marked as `tunesmith
        inspect` marks it; the row count), or the one-line error as the count."""
        try:
            path = self.confinement.check(dataset, "Dataset")
            if model and model.strip():
                self.confinement.check(model, "Model")
            tokenizer = self._tokenizer(model.strip() or None if model else None)
            records = inspect_rows(tokenizer, SFTDataArguments(data_path=[path]))
        except UserError as e:
            return "", f"tunesmith: {e.kind}: {e}"
        count = len({(r["source"], r["line"], r.get("row")) for r in records})
        shown_rows = []
        for r in records[:rows]:
            if "error" in r:
                shown_rows.append(f"<div class='ts-row'><b>line {r['line']}</b>: {html.escape(r['error'])}</div>")
                continue
            text = html.escape(highlight_trained(tokenizer, r["input_ids"], r["labels"], color=False))
            text = text.replace(PLAIN_ON, "<mark>").replace(PLAIN_OFF, "</mark>")
            shown_rows.append(f"<div class='ts-row'><b>line {r['line']}</b><pre>{text}</pre></div>")
        return "".join(shown_rows), f"{count} rows in {path}; the trained text is highlighted"

    def _tokenizer(self, model: str | None) -> Any:
        if model not in self._tokenizers:
            self._tokenizers[model] = load_tokenizer(ModelArguments(model_name_or_path=model))
        return self._tokenizers[model]

    # -- Runs
    def running_dirs(self) -> set[str]:
        job = self.jobs.get("train")
        return {os.path.realpath(self.train_dir)} if job is not None and job.running and self.train_dir else set()

    def runs_table(self) -> list[list[Any]]:
        return runs_mod.table(self.root, self.running_dirs())

    def run_details(self, name: str) -> tuple[str, list[dict], str]:
        """(config JSON, loss points, log) of the run named as the Runs table names it."""
        run = next((r for r in runs_mod.find_runs(self.root) if r.name == name), None)
        if run is None:
            return f"no run {name!r} under {self.root}", [], ""
        log = tail(runs_mod.log_path(self.root, run.path)) or "(no log: this run was not started from the page)"
        return (json.dumps(run.config, indent=2, default=str), runs_mod.series(run.metrics(), ("loss", "eval_loss")),
                log)

    def adapters(self) -> list[str]:
        return [r.path for r in runs_mod.find_runs(self.root) if r.is_adapter()]

    def models_under_root(self) -> list[str]:
        return [r.path for r in runs_mod.find_runs(self.root) if not r.is_adapter()
                and os.path.isfile(os.path.join(r.path, "config.json"))]

    # -- Chat
    def chat(self, message: str, history: list[dict], model: str = "", adapter: str = "",
             compare: bool = False, base_history: list[dict] | None = None, temperature: float = 0.7,
             top_p: float = 0.9, max_new_tokens: int = 128, system: str = "", picture: str | None = None
             ) -> Iterator[tuple[list, list]]:
        """Stream the reply (and with compare, the base model's reply to the same message, beside it) as the
        Chatbots' message lists. `picture`: a file the page uploaded, shown with the message (a vision-language
        model)."""
        history, base_history = list(history or []), list(base_history or [])
        try:
            model = self.confinement.check(model, "Model") if model and model.strip() else ""
            adapter = self.confinement.check(adapter, "adapter") if adapter and adapter.strip() else ""
        except UserError as e:
            yield history + [{"role": "assistant", "content": f"tunesmith: {e.kind}: {e}"}], base_history
            return
        generation = GenerationArguments(do_sample=temperature > 0, temperature=max(temperature, 1e-5), top_p=top_p,
                                         max_new_tokens=int(max_new_tokens))
        columns = [(history, adapter or None)]
        if compare and adapter:
            columns.append((base_history, None))
        shown = [{"role": "user", "content": {"path": picture}}] if picture else []
        for conversation, column_adapter in columns:
            earlier = list(conversation)
            conversation += [*shown, {"role": "user", "content": message}, {"role": "assistant", "content": ""}]
            try:
                chat = session(self.models, model or None, column_adapter, earlier, generation, system,
                               self.chat_path)
                if picture:
                    outcome = chat.handle(f"/image {picture}")
                    if outcome.kind == "error":
                        raise ConfigError(outcome.text)
                for text in stream_reply(chat, message):
                    conversation[-1] = {"role": "assistant", "content": text}
                    yield history, base_history
            except UserError as e:  # a model or adapter that cannot load: the CLI's one line, in the chat
                conversation[-1] = {"role": "assistant", "content": f"tunesmith: {e.kind}: {e}"}
                yield history, base_history

    def chat_path(self, path: str, mode: str) -> str:
        """Where Chat's commands may touch files: /image and pictures read from the UI's folders, /save written
        under --root (a bare name: there)."""
        return self.confinement.under_root(path, "/save") if mode == "write" else self.confinement.check(path, "/image")

    # -- Evaluate and Export: one command each, followed as it runs
    def follow(self, kind: str, argv: list[str]) -> Iterator[str]:
        """Start `argv` as the page's `kind` job and yield its log until it ends."""
        job = self.jobs.get(kind)
        if job is not None and job.running:
            yield f"a {kind} run is going already"
            return
        job = self.jobs[kind] = Job(argv, os.path.join(self.root, runs_mod.LOG_FOLDER, f"{kind}.log"))
        while job.running:
            yield job.log()
            time.sleep(1.0)
        yield job.log()

    def eval_argv(self, adapter: str, tasks: list[str], prompts: str = "", limit: float | None = None,
                  model: str = "") -> list[str]:
        """`tunesmith eval` of base vs tuned on shipped tasks, or `tunesmith compare` on a file of prompts."""
        adapter = self.confinement.check(adapter, "adapter")
        flags = ["--adapter_name_or_path", adapter] + (["--model_name_or_path", self.confinement.check(model, "Model")]
                                                       if model and model.strip() else [])
        name = os.path.basename(os.path.normpath(adapter))
        if prompts and prompts.strip():
            return tunesmith_argv("compare", flags + ["--data_path", self.confinement.check(prompts, "prompts file"),
                                                      "--output_path", os.path.join(self.root, "compare", name)])
        if not tasks:
            raise PathError("pick at least one task, or give a file of prompts")
        output = os.path.join(self.root, "eval", name)
        flags += ["--tasks", ",".join(tasks), "--compare_to", "base", "--output_path", output]
        if limit:
            flags += ["--limit", str(int(limit) if float(limit).is_integer() else limit)]
        return tunesmith_argv("eval", flags)

    def eval_results(self, argv: list[str]) -> list[dict]:
        """The table of a finished evaluation: the rows of the compare.json it wrote (`tunesmith eval`: per task
        and metric; `tunesmith compare`: each question's two answers); none after a failed run (an earlier run's
        file may be there)."""
        job = self.jobs.get("eval")
        if job is not None and job.returncode != 0:
            return []
        return compare_table(os.path.join(argv[argv.index("--output_path") + 1], "compare.json"))

    def export_argv(self, action: str, source: str, dtype: str = "f16") -> list[str]:
        """merge (a folder beside the adapter) or GGUF (a .gguf and its Ollama Modelfile) of a run."""
        source = self.confinement.check(source, "model or adapter")
        name = os.path.basename(os.path.normpath(source))
        if action == "merge":
            return tunesmith_argv("merge", ["--adapter_name_or_path", source, "--output_dir",
                                            os.path.join(self.root, f"{name}_merged"), "--overwrite_output_dir"])
        output = os.path.join(self.root, "gguf", f"{name}-{dtype}.gguf")
        os.makedirs(os.path.dirname(output), exist_ok=True)
        return tunesmith_argv("export", ["--model_name_or_path", source, "--output_file", output, "--dtype", dtype,
                                         "--overwrite_output_file"])

    def merge_argv(self, method: str, models: Sequence[str], base: str = "", weights: str = "",
                   density: float | None = None, slerp_t: float | None = None, name: str = "") -> list[str]:
        """`tunesmith merge --method METHOD --models ...`: runs' models or adapters merged through mergekit into
        <root>/NAME (default merge_METHOD). Empty boxes are left out, so that the CLI's defaults and rules apply."""
        if method not in MERGE_METHODS:
            raise ConfigError(f"Merge method {method!r} is not one of {', '.join(MERGE_METHODS)}")
        flags = ["--method", method, "--models", *(self.confinement.check(m, "model or adapter") for m in models)]
        if base and base.strip():
            flags += ["--model_name_or_path", self.confinement.check(base, "base model")]
        if weights and weights.strip():
            flags += ["--weights", *weights.replace(",", " ").split()]
        for flag, value in (("--density", density), ("--slerp_t", slerp_t)):
            if value not in (None, ""):
                flags += [flag, str(value)]
        output = self.confinement.under_root(name or f"merge_{method}")
        return tunesmith_argv("merge", [*flags, "--output_dir", output, "--overwrite_output_dir"])

    def produced_files(self, argv: list[str]) -> list[list[Any]]:
        """[path, size in MB] of what an export command wrote."""
        if "--output_dir" in argv:
            folder = argv[argv.index("--output_dir") + 1]
            paths = [os.path.join(folder, f) for f in sorted(os.listdir(folder))] if os.path.isdir(folder) else []
        else:
            out = argv[argv.index("--output_file") + 1]
            paths = [p for p in (out, out[: -len(".gguf")] + ".Modelfile") if os.path.isfile(p)]
        return [[p, round(os.path.getsize(p) / 1e6, 2)] for p in paths if os.path.isfile(p)]


def check_lines(job: Job) -> str:
    """What an export (or merge) job reported of what it wrote and how it was checked, and its one-line error if it
    failed with one: its `check` and `error` events (utils/events.py)."""
    return "\n".join(e["text"] for e in job.events() if e.get("event") in ("check", "error"))[-20000:]


def compare_table(path: str) -> list[dict]:
    """The rows of a compare.json (evaluation/compare.py and evaluation/command.py write it); none where it is
    missing (a run that failed)."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)["rows"]


def embedded_model_note() -> str:
    return f"empty: the embedded {DEFAULT_MODEL_NAME}"
