"""The page: five tabs (Train, Runs, Chat, Evaluate, Export) wired to ui/actions.py. Labels are a contract
(the browser test and users find components by them): Stage, Model, Dataset, Max steps, Start, Stop, Loss,
Log, Message, Send."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gradio as gr
import pandas as pd
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ..errors import UserError
from ..utils.network import LOOPBACK_HOSTS
from .actions import SHIPPED_TASKS, Workbench, check_lines, embedded_model_note
from .command_lines import (
    GGUF_DTYPES,
    LORA_INITS,
    MERGE_METHODS,
    METHODS,
    OPTIMS,
    QAT_SCHEMES,
    STAGES,
    TrainForm,
)
from .runs import COLUMNS

CSS = ".ts-row pre {white-space: pre-wrap; font-size: 0.85em} .ts-row mark {background: #b7f5c0}"
REFRESH_S = 1.0
LOOPBACK_NAMES = ["127.0.0.1", "localhost", "[::1]"]  # Host headers that name this machine (IPv6 in brackets)
LOSSES = ("loss", "eval_loss")


def _frame(points: list[dict], series: tuple[str, ...] = ()) -> pd.DataFrame:
    """Plot points, numeric even when there are none yet (an empty frame of objects would make the plot's axes
    categorical for good), with a blank point (no value: not drawn) for each of the plot's series: the page
    fixes a plot's colours from the series of its first data, so they must all be there from the start."""
    first = min((p["step"] for p in points), default=0)  # where the blanks sit: not widening the step axis
    blanks = [{"step": first, "value": float("nan"), "series": name} for name in series]
    frame = pd.DataFrame(blanks + list(points or []), columns=["step", "value", "series"])
    return frame.astype({"step": "int64", "value": "float64", "series": "string"})


# Each plot's series and colours, fixed up front: a plot that starts empty would otherwise have no colour for them.
SERIES_COLORS = {"loss": "#1f77b4", "eval_loss": "#ff7f0e", "learning_rate": "#2ca02c", "grad_norm": "#d62728"}


def _plot(label: str, series: tuple[str, ...]) -> gr.LinePlot:
    return gr.LinePlot(_frame([], series), x="step", y="value", color="series", label=label, show_label=True, height=260,
                       color_map={k: SERIES_COLORS[k] for k in series}, y_title=label.lower(),
                       elem_id=f"plot-{label.lower().replace(' ', '-')}")


def progress_html(p: dict[str, Any]) -> str:
    total, step = p["total"], p["step"]
    fraction = min(step / total, 1.0) if total else 0.0
    eta = f", ETA {int(p['eta']) // 60}:{int(p['eta']) % 60:02d}" if p["eta"] is not None else ""
    of = f"/{total}" if total else ""
    return (f"<div id='ts-progress'><progress value='{fraction:.3f}' max='1' style='width:100%'></progress>"
            f"<div>{p['status']}: step {step}{of}{eta}</div></div>")


def launch(app: gr.Blocks, host: str, port: int, credentials: tuple[str, str] | None = None,
           block: bool = True) -> None:
    """Serve the page. On this machine's loopback it answers only requests addressed to a loopback name: a web page
    whose own domain name is made to resolve to 127.0.0.1 (DNS rebinding) sends that name as the Host and is
    refused (Gradio's CORS check lets any Host that is not a loopback name through). block=False: return once
    it listens (tests)."""
    hosts = [Middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_NAMES)] if host in LOOPBACK_HOSTS else []
    app.queue().launch(server_name=host, server_port=port, auth=credentials, css=CSS, show_error=True, quiet=True,
                       app_kwargs={"middleware": hosts}, prevent_thread_lock=not block)


def build(bench: Workbench) -> gr.Blocks:
    with gr.Blocks(title="tunesmith") as app:
        gr.Markdown("## tunesmith\nEvery button runs the `tunesmith` command shown, as its own process.")
        with gr.Tab("Train"):
            _train_tab(bench)
        with gr.Tab("Runs"):
            _runs_tab(bench)
        with gr.Tab("Chat"):
            _chat_tab(bench)
        with gr.Tab("Evaluate"):
            _eval_tab(bench)
        with gr.Tab("Export"):
            _export_tab(bench)
    return app


def _train_tab(bench: Workbench) -> None:
    with gr.Row():
        stage = gr.Dropdown(list(STAGES), value="sft", label="Stage")
        model = gr.Textbox(label="Model", info=embedded_model_note(), elem_id="ts-model")
        dataset = gr.Textbox(label="Dataset", placeholder="data/demo/sft.jsonl", info="a data file (JSONL/JSON)",
                             elem_id="ts-dataset")
        max_steps = gr.Number(label="Max steps", value=None, precision=0, info="0: the CLI's default (epochs)")
    with gr.Row():
        method = gr.Radio(list(METHODS), value="lora", label="Method")
        learning_rate = gr.Number(label="Learning rate", value=None, info="0: the stage's default")
        epochs = gr.Number(label="Epochs", value=None, info="0: the stage's default")
        lora_rank = gr.Number(label="LoRA rank", value=None, precision=0, info="0: the default (16)")
        output_dir = gr.Textbox(label="Output folder", placeholder=f"{bench.root}/<stage>_N")
    with gr.Row():  # the LoRA variants (docs/sft.md); a full fine-tune refuses them in one line
        use_dora = gr.Checkbox(label="DoRA", value=False, info="--use_dora: a trained magnitude per output row")
        use_rslora = gr.Checkbox(label="rsLoRA", value=False, info="--use_rslora: scale by alpha / sqrt(r)")
        init_lora_weights = gr.Dropdown(list(LORA_INITS), value="", label="LoRA init",
                                        info="--init_lora_weights; empty: LoRA's own (B at zero)")
        loraplus_lr_ratio = gr.Number(label="LoRA+ ratio", value=None,
                                      info="--loraplus_lr_ratio: B's learning rate / A's; 0: off")
        qat = gr.Dropdown(["", *QAT_SCHEMES], value="", label="QAT",
                          info="--qat: train fake-quantized, save quantized/ (LoRA: with --lora_dropout 0)")
        optim = gr.Dropdown(list(OPTIMS), value="", label="Optimizer",
                            info="--optim; empty: the CLI's default (AdamW); muon: Muon for the weight matrices")
    config = gr.Textbox(bench.demo_config, label="Run config", elem_id="ts-config",
                        info="optional: a YAML/JSON run config read first (the quickstart's: configs/sft_lora_demo.yaml); "
                        "the fields above override it")
    advanced = gr.Textbox(label="Advanced flags", placeholder="--logging_steps 1 --save_steps 10 (any other flag of the stage)",
                          elem_id="ts-advanced")
    command = gr.Code(bench.command_line(TrainForm(config=bench.demo_config)), label="Command line (copy it to run the same in a shell)",
                      language="shell", interactive=False, elem_id="ts-command")
    with gr.Row():
        start = gr.Button("Start", variant="primary")
        stop = gr.Button("Stop", variant="stop")
    message = gr.Textbox(label="Status", interactive=False, elem_id="ts-status")
    progress = gr.HTML(progress_html(bench.progress()))
    with gr.Row():
        loss = _plot("Loss", LOSSES)
        lr = _plot("Learning rate", ("learning_rate",))
        grad = _plot("Grad norm", ("grad_norm",))
    log = gr.Textbox(label="Log", lines=12, max_lines=12, autoscroll=True, interactive=False, elem_id="ts-log")
    with gr.Accordion("Dataset preview", open=True):
        rows = gr.Markdown(elem_id="ts-rowcount")
        preview = gr.HTML()

    fields = [stage, model, dataset, max_steps, method, learning_rate, epochs, lora_rank, output_dir, advanced, config,
              use_dora, use_rslora, init_lora_weights, loraplus_lr_ratio, qat, optim]  # in TrainForm's order

    def form(*values: Any) -> TrainForm:
        return TrainForm(*values)

    for field in fields:
        field.change(lambda *v: bench.command_line(form(*v)), fields, command)
    dataset.change(lambda d, m: bench.preview(d, m), [dataset, model], [preview, rows])
    start.click(lambda *v: bench.start(form(*v)), fields, message)
    # after Stop the output folder is the stopped run's, so that Start resumes it from its last checkpoint
    stop.click(lambda: (bench.stop(), bench.train_dir or ""), None, [message, output_dir])

    def refresh():
        p = bench.progress()
        return (progress_html(p), _frame(p["loss"], LOSSES), _frame(p["lr"], ("learning_rate",)),
                _frame(p["grad_norm"], ("grad_norm",)), p["log"],
                p["error"] or gr.skip())

    gr.Timer(REFRESH_S).tick(refresh, None, [progress, loss, lr, grad, log, message])


def _runs_tab(bench: Workbench) -> None:
    table = gr.Dataframe(value=pd.DataFrame(bench.runs_table(), columns=COLUMNS), label="Runs", interactive=False,
                         elem_id="ts-runs")
    refresh = gr.Button("Refresh")
    picked = gr.Dropdown(label="Run", choices=[r[0] for r in bench.runs_table()], allow_custom_value=True)
    with gr.Row():
        config = gr.Code(label="Config", language="json", elem_id="ts-run-config")
        loss = _plot("Run loss", LOSSES)
    log = gr.Textbox(label="Run log", lines=10, max_lines=10, interactive=False)

    def update():
        rows = bench.runs_table()
        return pd.DataFrame(rows, columns=COLUMNS), gr.update(choices=[r[0] for r in rows])

    refresh.click(update, None, [table, picked])
    gr.Timer(5.0).tick(update, None, [table, picked])

    def details(name):
        text, points, run_log = bench.run_details(name or "")
        return text, _frame(points, LOSSES), run_log

    picked.change(details, picked, [config, loss, log])

    def pick(evt: gr.SelectData):
        return (evt.row_value or [None])[0]

    table.select(pick, None, picked)


def _chat_tab(bench: Workbench) -> None:
    with gr.Row():
        model = gr.Dropdown(label="Chat model", choices=[""] + bench.models_under_root(), value="",
                            allow_custom_value=True, info=embedded_model_note())
        adapter = gr.Dropdown(label="Adapter", choices=[""] + bench.adapters(), value="", allow_custom_value=True,
                              info="a run's adapter, or empty for the model alone")
        compare = gr.Checkbox(label="compare base and tuned", value=False)
    with gr.Accordion("Sampling", open=True), gr.Row():
        temperature = gr.Slider(0.0, 2.0, value=0.7, step=0.05, label="Temperature", info="0: greedy")
        top_p = gr.Slider(0.05, 1.0, value=0.9, step=0.05, label="Top p")
        max_new_tokens = gr.Slider(1, 1024, value=128, step=1, label="Max new tokens")
        system = gr.Textbox(label="System prompt", placeholder="(the template's default)")
    with gr.Row():
        tuned = gr.Chatbot(label="Tuned", height=360, elem_id="ts-chat")
        base = gr.Chatbot(label="Base", height=360, visible=False, elem_id="ts-chat-base")
    with gr.Row():
        message = gr.Textbox(label="Message", placeholder="Say something", elem_id="ts-message", scale=4)
        picture = gr.Image(label="Picture (a vision-language model)", type="filepath", sources=["upload"],
                           height=120, elem_id="ts-picture", scale=1)
    with gr.Row():
        send = gr.Button("Send", variant="primary")
        clear = gr.Button("Clear")
    compare.change(lambda c: gr.update(visible=c), compare, base)

    def refresh_choices():
        return gr.update(choices=[""] + bench.models_under_root()), gr.update(choices=[""] + bench.adapters())

    model.focus(refresh_choices, None, [model, adapter])
    adapter.focus(refresh_choices, None, [model, adapter])
    inputs = [message, tuned, model, adapter, compare, base, temperature, top_p, max_new_tokens, system, picture]
    send.click(bench.chat, inputs, [tuned, base]).then(lambda: ("", None), None, [message, picture])
    message.submit(bench.chat, inputs, [tuned, base]).then(lambda: ("", None), None, [message, picture])
    clear.click(lambda: ([], []), None, [tuned, base])


def _eval_tab(bench: Workbench) -> None:
    gr.Markdown("Base vs tuned: `tunesmith eval --compare_to base` on the shipped tasks, or `tunesmith compare` "
                "on a file of prompts.")
    with gr.Row():
        adapter = gr.Dropdown(label="Tuned adapter", choices=bench.adapters(), allow_custom_value=True)
        tasks = gr.CheckboxGroup(list(SHIPPED_TASKS), value=["tunesmith_identity"], label="Tasks")
        limit = gr.Number(label="Limit (documents per task)", value=20)
        prompts = gr.Textbox(label="Prompts file", placeholder="data/demo/identity_heldout.jsonl (instead of tasks)")
    run = gr.Button("Evaluate", variant="primary")
    results = gr.Dataframe(label="Results", interactive=False)
    log = gr.Textbox(label="Evaluation log", lines=10, max_lines=10, interactive=False)

    def evaluate(adapter, tasks, limit, prompts):
        try:
            argv = bench.eval_argv(adapter or "", tasks, prompts, limit)
        except UserError as e:  # its one line in the page
            yield pd.DataFrame(), f"tunesmith: {e.kind}: {e}"
            return
        for text in bench.follow("eval", argv):
            yield gr.skip(), text
        yield pd.DataFrame(bench.eval_results(argv)), bench.jobs["eval"].log()

    run.click(evaluate, [adapter, tasks, limit, prompts], [results, log])
    adapter.focus(lambda: gr.update(choices=bench.adapters()), None, adapter)


def _export_tab(bench: Workbench) -> None:
    with gr.Row():
        source = gr.Dropdown(label="Adapter or model", choices=bench.adapters(), allow_custom_value=True)
        action = gr.Radio(["merge", "gguf"], value="gguf", label="Export", info="gguf writes an Ollama Modelfile too")
        dtype = gr.Dropdown(list(GGUF_DTYPES), value="f16", label="GGUF dtype")
    run = gr.Button("Export", variant="primary")
    files = gr.Dataframe(headers=["file", "MB"], label="Produced files", interactive=False)
    checks = gr.Textbox(label="Checks", lines=6, interactive=False)
    log = gr.Textbox(label="Export log", lines=10, max_lines=10, interactive=False)

    def export(source, action, dtype):
        yield from _follow_export_job(bench, lambda: bench.export_argv(action, source or "", dtype))

    run.click(export, [source, action, dtype], [files, checks, log])
    source.focus(lambda: gr.update(choices=bench.adapters() + bench.models_under_root()), None, source)
    _merge_form(bench, files, checks, log)


def _follow_export_job(bench: Workbench, build_argv: Any) -> Iterator[tuple]:
    """Run the command build_argv() gives in the Export tab's job, its log shown as it grows, then the files it
    wrote and its checks' lines; a refused form is one line."""
    try:
        argv = build_argv()
    except UserError as e:
        yield pd.DataFrame(), "", f"tunesmith: {e.kind}: {e}"
        return
    for text in bench.follow("export", argv):
        yield gr.skip(), gr.skip(), text
    text = bench.jobs["export"].log(200000)
    yield (pd.DataFrame(bench.produced_files(argv), columns=["file", "MB"]), check_lines(bench.jobs["export"]),
           text[-20000:])


def _merge_form(bench: Workbench, files: Any, checks: Any, log: Any) -> None:
    """`tunesmith merge --method`: several runs' models or adapters merged through mergekit (docs/merge.md)."""
    with gr.Accordion("Merge several models (mergekit)", open=False):
        with gr.Row():
            models = gr.Dropdown(label="Models", choices=bench.adapters() + bench.models_under_root(), multiselect=True,
                                 allow_custom_value=True, info="two or more models or adapters of one base; the "
                                 "first one's tokenizer and chat template are kept")
            method = gr.Dropdown(list(MERGE_METHODS), value="linear", label="Merge method")
            base = gr.Dropdown(label="Base (ties, dare_ties)", choices=[""] + bench.models_under_root(), value="",
                               allow_custom_value=True, info="the model the others were fine-tuned from")
        with gr.Row():
            weights = gr.Textbox(label="Weights", placeholder="1 1", info="one per model (linear, ties, dare_ties)")
            density = gr.Number(label="Density", value=None, info="ties, dare_ties: share kept, empty: 0.5")
            slerp_t = gr.Number(label="Slerp t", value=None, info="slerp: 0 the first model, 1 the second")
            name = gr.Textbox(label="Output folder", placeholder=f"{bench.root}/merge_<method>")
        run = gr.Button("Merge", variant="primary")

    def merge(models, method, base, weights, density, slerp_t, name):
        yield from _follow_export_job(bench, lambda: bench.merge_argv(method, models or [], base or "", weights or "",
                                                                      density, slerp_t, name or ""))

    run.click(merge, [models, method, base, weights, density, slerp_t, name], [files, checks, log])
    models.focus(lambda: gr.update(choices=bench.adapters() + bench.models_under_root()), None, models)
    base.focus(lambda: gr.update(choices=[""] + bench.models_under_root()), None, base)
