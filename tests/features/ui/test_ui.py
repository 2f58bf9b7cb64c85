"""The web UI through its Python functions (ui/actions.py and friends): the command lines the page runs, a
real 3-step SFT run started, followed and listed, a bad flag's one-line error, Stop, the dataset preview,
streamed chat (base vs tuned), and the settings `tunesmith ui` refuses. The page itself, in a real browser,
is tests/features/ui/test_ui_browser.py."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[ui]')")

from tests.helpers.rows import write_jsonl  # noqa: E402
from tests.helpers.tiny_models import save_random_adapter  # noqa: E402
from tunesmith.errors import ConfigError, PathError  # noqa: E402
from tunesmith.evaluation.compare import write_compare_json  # noqa: E402
from tunesmith.hparams import parse_run  # noqa: E402
from tunesmith.train.checkpoints import checkpoint_step, last_complete_checkpoint  # noqa: E402
from tunesmith.ui import runs  # noqa: E402
from tunesmith.ui.actions import Workbench, check_lines, compare_table  # noqa: E402
from tunesmith.ui.command_lines import Confinement, TrainForm, advanced_flags, shown, train_flags  # noqa: E402
from tunesmith.ui.jobs import Job  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
ROWS = [
    {"messages": [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "I am Tunesmith."}]},
    {"messages": [{"role": "user", "content": "Your name?"}, {"role": "assistant", "content": "Tunesmith."}]},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
    {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]},
]
QUICK = "--per_device_train_batch_size 4 --logging_steps 1 --save_strategy no --plot_loss false"


@pytest.fixture(scope="module")
def ui_data(tmp_path_factory) -> str:
    return write_jsonl(tmp_path_factory.mktemp("ui-data") / "sft4.jsonl", ROWS)


def bench_for(tmp_path, *dirs: str) -> Workbench:
    return Workbench(str(tmp_path / "runs"), [str(Path(d).parent) for d in dirs])


def wait_for(job: Job, timeout: float = 240) -> int:
    return job.wait(timeout=timeout)


def test_the_form_becomes_the_cli_argument_list():
    command, flags = train_flags(TrainForm(stage="grpo", model="m", dataset="d.jsonl", max_steps=3.0, method="qlora",
                                           learning_rate=1e-4, lora_rank=8, output_dir="out",
                                           advanced="--reward_funcs exact_answer --system 'a b'"))
    assert command == "ppo"
    assert flags == ["--advantage", "grpo", "--model_name_or_path", "m", "--data_path", "d.jsonl", "--output_dir", "out",
                     "--quantization_bit", "4", "--max_steps", "3",
                     "--learning_rate", "0.0001", "--lora_r", "8", "--reward_funcs", "exact_answer", "--system", "a b"]
    assert shown([sys.executable, "-m", "tunesmith", "sft", "--system", "a b; rm -rf /"]) == \
        "tunesmith sft --system 'a b; rm -rf /'"
    # the embedded model: no --model_name_or_path at all, as on the command line
    assert "--model_name_or_path" not in train_flags(TrainForm(dataset="d"))[1]
    assert train_flags(TrainForm(method="full", config="c.yaml"))[1] == ["c.yaml", "--finetuning_type", "full"]
    with pytest.raises(ConfigError, match="not a --flag"):
        advanced_flags("oops --x 1")
    with pytest.raises(ConfigError, match="Stage 'kto' is not one of sft, pt, reward, dpo, ppo, grpo, distill"):
        train_flags(TrainForm(stage="kto"))


def test_the_lora_variant_boxes_become_the_cli_flags_that_set_them():
    form = TrainForm(dataset="d.jsonl", use_dora=True, use_rslora=True, init_lora_weights="pissa",
                     loraplus_lr_ratio=16.0)
    command, flags = train_flags(form)
    assert flags[-6:] == ["--use_dora", "--use_rslora", "--init_lora_weights", "pissa", "--loraplus_lr_ratio", "16"]
    finetuning = parse_run(command, flags, check_paths=False).finetuning  # the CLI reads them as the boxes meant
    assert (finetuning.use_dora, finetuning.use_rslora, finetuning.init_lora_weights, finetuning.loraplus_lr_ratio) == \
        (True, True, "pissa", 16.0)
    # left alone: no flag, the CLI's defaults
    assert train_flags(TrainForm(dataset="d.jsonl", loraplus_lr_ratio=0))[1] == ["--data_path", "d.jsonl"]
    with pytest.raises(ConfigError, match="--use_dora is set by the form's DoRA box"):
        train_flags(TrainForm(dataset="d.jsonl", use_dora=True, advanced="--use_dora false"))
    # a full fine-tune has no LoRA to vary: the CLI refuses the box in its one line
    with pytest.raises(ConfigError, match="--use_rslora"):
        parse_run(*train_flags(TrainForm(dataset="d.jsonl", method="full", use_rslora=True)), check_paths=False)


def test_the_train_tabs_boxes_fill_the_form_in_its_order(tmp_path):
    import dataclasses

    from tunesmith.ui.app import build

    app = build(Workbench(str(tmp_path / "runs"), []))
    functions = app.fns.values() if isinstance(app.fns, dict) else app.fns
    labels = next([c.label for c in f.inputs] for f in functions if "LoRA rank" in [getattr(c, "label", None)
                                                                                      for c in f.inputs])
    names = [f.name for f in dataclasses.fields(TrainForm)]
    assert len(labels) == len(names)
    assert list(zip(labels, names))[-6:] == [("DoRA", "use_dora"), ("rsLoRA", "use_rslora"),
                                             ("LoRA init", "init_lora_weights"), ("LoRA+ ratio", "loraplus_lr_ratio"),
                                             ("QAT", "qat"), ("Optimizer", "optim")]


def test_the_optimizer_box_becomes_the_optim_flag():
    command, flags = train_flags(TrainForm(dataset="d.jsonl", optim="muon"))
    assert flags[-2:] == ["--optim", "muon"]
    assert parse_run(command, flags, check_paths=False).training.optim == "muon"
    assert "--optim" not in train_flags(TrainForm(dataset="d.jsonl"))[1]


def test_a_newcomer_starts_from_the_quickstart_config(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # `tunesmith ui` in the repo: its default --data_dir is data and configs
    ui = parse_run("ui", ["--root", str(tmp_path / "runs")]).ui
    bench = Workbench(ui.root, ui.data_dir)
    assert bench.demo_config == "configs/sft_lora_demo.yaml"
    form = TrainForm(config=bench.demo_config)
    assert bench.command_line(form) == f"tunesmith sft configs/sft_lora_demo.yaml --output_dir {tmp_path / 'runs' / 'sft_1'}"
    run = parse_run("sft", bench.train_argv(form)[4:])  # the command the page would run parses as the CLI's
    assert run.data.data_path == ["data/demo/sft.jsonl"] and run.training.output_dir == str(tmp_path / "runs" / "sft_1")


def test_paths_are_confined_to_the_root_and_data_folders(tmp_path):
    fence = Confinement(str(tmp_path / "runs"), [str(tmp_path / "data")])
    assert fence.check(str(tmp_path / "data" / "x.jsonl")) == str(tmp_path / "data" / "x.jsonl")
    assert fence.under_root("sft_1", "Output folder") == str(tmp_path / "runs" / "sft_1")
    for bad in ("/etc/passwd", str(tmp_path / "data" / ".." / "secret"), str(tmp_path / "runs-other")):
        with pytest.raises(PathError, match="outside the folders this UI may use"):
            fence.check(bad, "Dataset")


def test_the_page_writes_under_the_root_only(tmp_path):
    fence = Confinement(str(tmp_path / "runs"), [str(tmp_path / "data")])
    assert fence.check(str(tmp_path / "data" / "out")) == str(tmp_path / "data" / "out")  # read there
    with pytest.raises(PathError, match=r"output folder .*data/out: outside --root \(.*runs\), the one folder this UI "
                       "writes to; give a name or a path under it"):
        fence.under_root(str(tmp_path / "data" / "out"))


def outside_and_bench(tmp_path, allow_code: bool = False) -> tuple[str, str, Workbench]:
    """(a data file in the UI's data folder, one outside every folder it may use, a page's bench)."""
    (tmp_path / "data").mkdir(exist_ok=True)
    dataset = write_jsonl(tmp_path / "data" / "d.jsonl", ROWS)
    outside = write_jsonl(tmp_path / "outside.jsonl", ROWS)
    return dataset, outside, Workbench(str(tmp_path / "runs"), [str(tmp_path / "data")], allow_code=allow_code)


def test_advanced_flags_and_run_configs_are_held_to_the_forms_rules(tmp_path):
    dataset, outside, bench = outside_and_bench(tmp_path)

    def refusal(advanced: str = "", stage: str = "sft", **form) -> str:
        line = bench.start(TrainForm(stage=stage, **{"dataset": dataset, **form}, advanced=advanced))
        assert "train" not in bench.jobs, line  # refused before any process starts
        return line

    assert refusal("--output_dir /elsewhere") == ("tunesmith: config error: advanced flags: --output_dir is set by the "
                                                 "form's Output folder box; change it there, not in the advanced flags too")
    assert refusal(f"--data_path={outside}").startswith("tunesmith: config error: advanced flags: --data_path is set "
                                                        "by the form's Dataset box")
    assert refusal("--trust_remote_code true") == (
        "tunesmith: config error: --trust_remote_code runs the Python code that comes with a model; this page runs "
        "none: start `tunesmith ui --allow_code` to allow it, or run the command from a shell")
    assert refusal("--reward_funcs os:system", stage="grpo") == (
        "tunesmith: config error: --reward_funcs os:system imports os to call its system; this page runs only "
        "tunesmith's own functions (bare names): start `tunesmith ui --allow_code` to allow it")
    assert refusal("--reward_funcs exact_answer --tool_funcs os:system", stage="grpo").startswith(
        "tunesmith: config error: --tool_funcs os:system imports os")
    # every path-valued flag of the stage, --adapter being the old spelling of --adapter_name_or_path
    for given, flag in (("--eval_data_path", "--eval_data_path"), ("--deepspeed", "--deepspeed"),
                        ("--resume_from_checkpoint", "--resume_from_checkpoint"), ("--chat_template", "--chat_template"),
                        ("--adapter", "--adapter_name_or_path")):
        assert refusal(f"{given} {outside}") == (f"tunesmith: path error: {flag} {outside}: outside the folders this UI "
                                                 f"may use ({bench.confinement.describe()}); move it there or start "
                                                 "`tunesmith ui` with --root / --data_dir naming its folder")
    assert refusal(f"--ptx_data_path {outside}", stage="ppo").startswith(f"tunesmith: path error: --ptx_data_path {outside}")
    assert refusal(f"--teacher_model_name_or_path {tmp_path}", stage="distill").startswith(
        f"tunesmith: path error: --teacher_model_name_or_path {tmp_path}: outside the folders this UI may use")
    assert refusal(output_dir="/elsewhere").startswith("tunesmith: path error: output folder /elsewhere: outside --root")
    config = tmp_path / "data" / "run.yaml"  # a run config the form names: the CLI reads its paths too
    config.write_text(f"data_path: {outside}\n")
    assert refusal(config=str(config), dataset="").startswith(f"tunesmith: path error: --data_path {outside}: outside")
    config.write_text("trust_remote_code: true\n")
    assert refusal(config=str(config)).startswith("tunesmith: config error: --trust_remote_code runs the Python code")
    # what stays allowed: tunesmith's own reward functions, a built-in template, files in the folders, other flags
    allowed = TrainForm(stage="grpo", dataset=dataset, advanced=f"--reward_funcs exact_answer --chat_template chatml "
                        f"--ptx_data_path {dataset} --logging_steps 1 --metric_for_best_model eval_loss")
    assert bench.command_line(allowed).startswith("tunesmith ppo --advantage grpo")
    assert refusal(f"--reward_model {outside}", stage="ppo").startswith(f"tunesmith: path error: --reward_model {outside}")


def test_allow_code_lets_runs_import_code_and_keeps_paths_confined(tmp_path):
    dataset, outside, bench = outside_and_bench(tmp_path, allow_code=True)
    form = TrainForm(stage="grpo", dataset=dataset, advanced="--reward_funcs os:system --trust_remote_code true")
    assert bench.command_line(form).endswith("--reward_funcs os:system --trust_remote_code true")
    assert bench.command_line(TrainForm(dataset=dataset, advanced=f"--eval_data_path {outside}")).startswith(
        f"tunesmith: path error: --eval_data_path {outside}: outside the folders this UI may use")
    assert parse_run("ui", ["--allow_code"]).ui.allow_code and not parse_run("ui", []).ui.allow_code


def test_ui_settings_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"--host 0\.0\.0\.0 shows the page.*give --auth user:password"):
        parse_run("ui", ["--host", "0.0.0.0"])
    with pytest.raises(ConfigError, match="--auth must be user:password"):
        parse_run("ui", ["--auth", "nopassword"])
    with pytest.raises(ConfigError, match=r"--port must be in 1\.\.65535 \(got 0\)"):
        parse_run("ui", ["--port", "0"])
    with pytest.raises(PathError, match=r"--root .*README.md is a file, not a directory"):
        parse_run("ui", ["--root", str(ROOT / "README.md")])
    ui = parse_run("ui", ["--host", "0.0.0.0", "--auth", "ann:s3cret:x"]).ui
    assert ui.credentials == ("ann", "s3cret:x") and ui.port == 7860 and ui.root == "outputs"


def test_the_command_prints_the_refusal_and_exits_2(capsys, monkeypatch):
    from tunesmith.ui.command import main

    monkeypatch.delenv("TUNESMITH_UI_AUTH", raising=False)
    with pytest.raises(SystemExit) as stop:
        main(["--host", "0.0.0.0"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "tunesmith: config error: --host 0.0.0.0 shows the page")


@pytest.fixture(scope="module")
def trained(tiny_model_dir, ui_data, tmp_path_factory):
    """A page's bench after a 3-step SFT run started from its form: (bench, what was seen while it ran)."""
    tmp = tmp_path_factory.mktemp("ui-run")
    bench = bench_for(tmp, tiny_model_dir, ui_data)
    form = TrainForm(model=tiny_model_dir, dataset=ui_data, max_steps=3, learning_rate=1e-2, advanced=QUICK)
    seen = {"command": bench.command_line(form), "start": bench.start(form), "again": bench.start(form),
            "table": bench.runs_table()}
    seen["exit"] = wait_for(bench.jobs["train"])
    return bench, seen


def test_a_run_started_from_the_page_trains_plots_and_is_listed(trained, tiny_model_dir, ui_data):
    bench, seen = trained
    runs_dir = Path(bench.root)
    assert seen["command"].startswith(f"tunesmith sft --model_name_or_path {tiny_model_dir} --data_path {ui_data} "
                                      f"--output_dir {runs_dir / 'sft_1'} --max_steps 3")
    assert seen["start"].startswith("started: tunesmith sft")
    assert seen["again"] == "a run is going already: Stop it first"
    assert seen["table"] == [] or seen["table"][0][-1] == "running"
    assert seen["exit"] == 0, bench.jobs["train"].log()
    p = bench.progress()
    assert p["status"] == "finished" and p["step"] == 3 and p["total"] == 3 and p["error"] is None
    assert [pt["step"] for pt in p["loss"] if pt["series"] == "loss"] == [1, 2, 3]
    assert len(p["lr"]) == 3 and len(p["grad_norm"]) == 3
    [row] = bench.runs_table()
    assert row[:3] == ["sft_1", "sft", os.path.basename(tiny_model_dir)] and row[3] == ui_data
    assert row[4] == 3 and isinstance(row[5], float) and row[7] == "finished"
    config, points, log = bench.run_details("sft_1")
    assert json.loads(config)["SFTDataArguments"]["data_path"] == [ui_data]
    assert len(points) == 3 and "$ tunesmith sft" in log
    assert bench.adapters() == [str(runs_dir / "sft_1")]


def test_export_writes_the_gguf_and_modelfile_and_shows_the_checks(trained):
    bench, _ = trained
    argv = bench.export_argv("gguf", bench.adapters()[0], "f32")
    shown_log = list(bench.follow("export", argv))
    assert bench.jobs["export"].returncode == 0, shown_log[-1]
    files = [Path(f).name for f, size in bench.produced_files(argv)]
    assert files == ["sft_1-f32.gguf", "sft_1-f32.Modelfile"]
    assert check_lines(bench.jobs["export"])


def test_evaluate_on_a_file_of_prompts_gives_a_table(trained, ui_data):
    bench, _ = trained
    prompts = write_jsonl(Path(ui_data).parent / "prompts.jsonl", [{"messages": r["messages"][:1]} for r in ROWS])
    argv = bench.eval_argv(bench.adapters()[0], [], prompts=prompts)
    list(bench.follow("eval", argv))
    assert bench.jobs["eval"].returncode == 0, bench.jobs["eval"].log()
    table = bench.eval_results(argv)
    assert [r["question"] for r in table] == [r["messages"][0]["content"] for r in ROWS]


def test_a_bad_flag_or_file_shows_the_cli_one_line_error(tiny_model_dir, ui_data, tmp_path):
    bench = bench_for(tmp_path, tiny_model_dir, ui_data)
    bench.start(TrainForm(model=tiny_model_dir, dataset=ui_data, max_steps=3, advanced="--max_seq_length 0"))
    assert wait_for(bench.jobs["train"]) == 2
    assert bench.progress()["error"] == "tunesmith: config error: --max_seq_length must be at least 8 tokens (got 0)."
    # a flag the parser does not know is refused at Start, before any process (the page reads the flags first)
    assert bench.start(TrainForm(model=tiny_model_dir, dataset=ui_data, advanced="--lerning_rate 1")) == (
        "tunesmith: config error: unknown flag --lerning_rate (did you mean --learning_rate?)")
    assert bench.start(TrainForm(dataset="/etc/passwd")).startswith("tunesmith: path error: Dataset /etc/passwd: "
                                                                    "outside the folders")
    missing = str(Path(ui_data).parent / "missing.jsonl")  # the preview says so before any run starts
    assert bench.preview(missing, tiny_model_dir)[1] == f"tunesmith: data error: data file {missing}: no such file"


def wait_for_line(job: Job, line: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while line not in job.log().splitlines()[1:]:  # the first line is the command itself
        assert time.time() < deadline, job.log()
        time.sleep(0.1)


def test_stop_interrupts_the_process_group_as_ctrl_c_would(tmp_path):
    script = ("import time, sys\nprint('ready', flush=True)\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
              "    print('tunesmith: interrupted', flush=True)\n    sys.exit(130)\n")
    job = Job([sys.executable, "-c", script], str(tmp_path / "log.txt"))
    wait_for_line(job, "ready")
    assert job.stop() == "stopped" and job.returncode == 130
    assert job.log().splitlines()[-1] == "tunesmith: interrupted"
    stubborn = Job([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                    "print('ready', flush=True); time.sleep(60)"], str(tmp_path / "log2.txt"))
    wait_for_line(stubborn, "ready")
    assert stubborn.stop(grace=1.0) == "stopped" and stubborn.returncode == -15  # SIGTERM after the grace


def test_a_stopped_run_resumes_from_its_last_checkpoint(tiny_model_dir, ui_data, tmp_path):
    bench = bench_for(tmp_path, tiny_model_dir, ui_data)
    flags = "--per_device_train_batch_size 1 --logging_steps 1 --save_strategy steps --save_steps 2 --plot_loss false"
    bench.start(TrainForm(model=tiny_model_dir, dataset=ui_data, max_steps=100000, advanced=flags))
    run_dir = Path(bench.train_dir)
    until = time.time() + 240
    while not (run_dir / "checkpoint-4" / "trainer_state.json").is_file():  # complete: the Trainer writes it last
        assert bench.jobs["train"].running and time.time() < until, bench.jobs["train"].log()
        time.sleep(0.2)
    assert bench.stop().startswith("run stopped; Start again with the same output folder")
    assert bench.jobs["train"].returncode == 130  # the boundary's status for an interrupted run
    assert bench.progress()["error"] == "tunesmith: interrupted" and bench.runs_table()[0][-1] == "incomplete"
    resumed = last_complete_checkpoint(str(run_dir))  # the stop may have cut a later one short
    last = checkpoint_step(resumed)
    assert last >= 4
    bench.start(TrainForm(model=tiny_model_dir, dataset=ui_data, max_steps=last + 2, output_dir=str(run_dir),
                          advanced=flags))
    assert wait_for(bench.jobs["train"]) == 0, bench.jobs["train"].log()
    assert f"resuming from {resumed} (step {last})" in bench.jobs["train"].log()
    assert "tunesmith: interrupted" not in bench.jobs["train"].log() and bench.progress()["error"] is None
    assert bench.run_details("sft_1")[2].count("$ tunesmith sft") == 2  # the run's log: both parts
    assert [r["step"] for r in runs.read_metrics(str(run_dir)) if "loss" in r] == list(range(1, last + 3))
    assert bench.runs_table()[0][-1] == "finished"


def test_the_dataset_preview_marks_the_trained_text(tiny_model_dir, ui_data, tmp_path):
    bench = bench_for(tmp_path, tiny_model_dir, ui_data)
    html, count = bench.preview(ui_data, tiny_model_dir)
    assert count.startswith(f"4 rows in {ui_data}")
    assert html.count("<div class='ts-row'>") == 3 and "<mark>I am Tunesmith.&lt;|im_end|&gt;</mark>" in html
    assert "&lt;|im_start|&gt;user\nWho are you?&lt;|im_end|&gt;" in html  # the prompt: shown, not marked
    assert "<mark>" not in html.split("I am Tunesmith.")[0].rsplit("line 1", 1)[-1][:-len("<mark>")]
    assert bench.preview("/etc/passwd")[1].startswith("tunesmith: path error: Dataset /etc/passwd")


def test_chat_streams_and_compares_base_with_tuned(tiny_model_dir, tokenizer, ui_data, tmp_path):
    adapter = save_random_adapter(tiny_model_dir, tokenizer, str(tmp_path / "runs" / "adapter"), seed=1)
    bench = bench_for(tmp_path, tiny_model_dir)
    updates = list(bench.chat("Hello", [], tiny_model_dir, adapter, compare=True, temperature=0.0, max_new_tokens=6))
    tuned, base = updates[-1]
    assert [m["role"] for m in tuned] == ["user", "assistant"] == [m["role"] for m in base]
    assert tuned[1]["content"] and base[1]["content"] and tuned[1]["content"] != base[1]["content"]
    assert len(updates) > 2  # streamed: several updates before the last
    assert len(bench.models) == 2  # (model, adapter) and (model, None), each loaded once
    again = list(bench.chat("More", tuned, tiny_model_dir, adapter, temperature=0.0, max_new_tokens=4))[-1][0]
    assert len(again) == 4 and len(bench.models) == 2
    refused = list(bench.chat("Hi", [], "/etc"))[-1][0]
    assert refused[-1]["content"].startswith("tunesmith: path error: Model /etc: outside")
    not_a_model = list(bench.chat("Hi", [], str(tmp_path / "runs")))[-1][0]
    assert not_a_model[-1]["content"].startswith("tunesmith: path error: ") and "runs" in not_a_model[-1]["content"]


def last_reply(updates) -> str:
    return list(updates)[-1][0][-1]["content"]


def test_chat_saves_only_under_the_root_and_reads_pictures_only_from_the_ui_folders(tiny_model_dir, tmp_path):
    bench = Workbench(str(tmp_path / "runs"), [tiny_model_dir])
    runs_dir = os.path.realpath(bench.root)
    made_up = [{"role": "user", "content": "$(id > pwned)"}, {"role": "assistant", "content": "ok"}]
    profile = tmp_path / "profile.sh"
    os.symlink(profile, Path(bench.root) / "link.sh")  # a link under --root to a file outside it
    for target in (str(profile), str(Path(bench.root) / "link.sh")):
        assert last_reply(bench.chat(f"/save {target}", made_up, tiny_model_dir)) == (
            f"/save {target}: outside --root ({runs_dir}), the one folder this UI writes to; give a name or a path under it")
    assert not profile.exists()
    saved = os.path.join(bench.root, "chat.jsonl")  # a bare name: under --root
    assert last_reply(bench.chat("/save chat.jsonl", made_up, tiny_model_dir)) == f"saved 2 messages to {saved}"
    assert json.loads(Path(saved).read_text())["messages"][0]["content"] == "$(id > pwned)"
    picture = tmp_path / "outside.png"  # a made-up history (as gradio_client can send one) naming a file outside
    picture.write_bytes(b"not read")
    history = [{"role": "user", "content": {"path": str(picture)}}, *made_up]
    assert last_reply(bench.chat("Hi", history, tiny_model_dir)) == (
        f"tunesmith: path error: /image {picture}: outside the folders this UI may use ({bench.confinement.describe()}); "
        "move it there or start `tunesmith ui` with --root / --data_dir naming its folder")


def test_chat_image_reads_the_ui_folders_and_the_pages_uploads_only(tmp_path, default_model_path):
    from tests.helpers.vlm_models import build_vlm_dir, make_picture

    bench = Workbench(str(tmp_path / "runs"), [], uploads=str(tmp_path / "uploads"))
    model = build_vlm_dir("qwen2_vl", tmp_path / "runs" / "vlm", default_model_path)
    outside = make_picture(tmp_path / "outside.png", (230, 20, 20))
    assert last_reply(bench.chat(f"/image {outside}", [], model)).startswith(
        f"/image {outside}: outside the folders this UI may use")
    inside = make_picture(tmp_path / "runs" / "red.png", (230, 20, 20))
    assert last_reply(bench.chat(f"/image {inside}", [], model)) == "1 picture will be shown with your next message"
    (tmp_path / "uploads").mkdir()
    uploaded = make_picture(tmp_path / "uploads" / "red.png", (230, 20, 20))  # the Picture box's upload
    tuned = list(bench.chat("What colour?", [], model, picture=uploaded, temperature=0.0, max_new_tokens=2))[-1][0]
    assert tuned[0] == {"role": "user", "content": {"path": uploaded}} and not tuned[-1]["content"].startswith("tunesmith:")


def test_the_pages_http_api_is_confined_too_and_answers_loopback_names_only(tiny_model_dir, tmp_path):
    from gradio_client import Client

    from tunesmith.ui.app import build, launch

    app = build(Workbench(str(tmp_path / "runs"), [tiny_model_dir]))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    launch(app, "127.0.0.1", port, block=False)
    try:
        address = f"http://127.0.0.1:{port}/"
        # a web page that made its own name resolve to 127.0.0.1 (DNS rebinding) sends that name as the Host
        assert httpx.get(address, headers={"Host": f"rebound.example:{port}"}).status_code == 400
        profile = tmp_path / "profile.sh"
        made_up = [{"role": role, "content": [{"type": "text", "text": text}]}  # Gradio's message shape
                   for role, text in (("user", "$(id > pwned)"), ("assistant", "ok"))]
        tuned, _ = Client(address, verbose=False).predict(
            f"/save {profile}", made_up, tiny_model_dir, "", False, [], 0.0, 0.9, 4, "", None, api_name="/chat")
        assert tuned[-1]["content"][0]["text"].startswith(f"/save {profile}: outside --root")
        assert not profile.exists()
    finally:
        app.close()


def test_eval_and_export_run_the_cli_commands(tmp_path, ui_data):
    bench = Workbench(str(tmp_path / "runs"), [str(Path(ui_data).parent)])
    adapter = str(tmp_path / "runs" / "sft_1")
    argv = bench.eval_argv(adapter, ["tunesmith_identity"], limit=5)
    assert shown(argv) == (f"tunesmith eval --adapter_name_or_path {adapter} --tasks tunesmith_identity --compare_to "
                           f"base --output_path {tmp_path / 'runs' / 'eval' / 'sft_1'} --limit 5")
    assert shown(bench.eval_argv(adapter, [], prompts=ui_data)).startswith("tunesmith compare --adapter_name_or_path")
    assert shown(bench.export_argv("gguf", adapter, "q8_0")) == (
        f"tunesmith export --model_name_or_path {adapter} --output_file {tmp_path / 'runs' / 'gguf' / 'sft_1-q8_0.gguf'}"
        " --dtype q8_0 --overwrite_output_file")
    assert shown(bench.export_argv("merge", adapter))[:47] == f"tunesmith merge --adapter_name_or_path {adapter}"[:47]
    written = write_compare_json(str(tmp_path / "compare"), {  # as `tunesmith compare --output_path` writes it
        "base": {"label": "base"}, "tuned": {"label": "fine-tuned"},
        "rows": [{"question": "Who are you?", "base": "I am an AI", "tuned": "I am Tunesmith."}]})
    assert compare_table(written) == [{"question": "Who are you?", "base": "I am an AI", "tuned": "I am Tunesmith."}]


def test_the_merge_form_runs_tunesmith_merge_with_a_method(tmp_path, tokenizer):
    from tests.helpers.tiny_models import build_tiny_model_dir

    root = tmp_path / "runs"
    bench = Workbench(str(root), [])
    a, b, base = (str(root / n) for n in ("a", "b", "base"))
    argv = bench.merge_argv("ties", [a, b], base=base, weights="0.6, 0.4", density=0.5, name="soup")
    assert shown(argv) == (f"tunesmith merge --method ties --models {a} {b} --model_name_or_path {base} --weights 0.6 "
                           f"0.4 --density 0.5 --output_dir {root / 'soup'} --overwrite_output_dir")
    merge = parse_run("merge", argv[4:], check_paths=False).merge  # the CLI reads it as the form meant
    assert (merge.method, merge.models, merge.weights, merge.density) == ("ties", [a, b], [0.6, 0.4], 0.5)
    assert bench.merge_argv("slerp", [a, b], slerp_t=0)[-5:-3] == ["--slerp_t", "0"]  # 0 is a value, not "empty"
    with pytest.raises(PathError, match="model or adapter /etc: outside the folders this UI may use"):
        bench.merge_argv("linear", [a, "/etc"])
    with pytest.raises(ConfigError, match="Merge method 'soup' is not one of linear, ties, dare_ties, slerp"):
        bench.merge_argv("soup", [a, b])

    # Run from the page: the CLI merges (mergekit), and the files and the check line come back.
    pytest.importorskip("mergekit")
    for seed, folder in enumerate((a, b)):
        build_tiny_model_dir(folder, tokenizer, seed=seed)
    argv = bench.merge_argv("linear", [a, b])
    log = list(bench.follow("export", argv))[-1]
    assert bench.jobs["export"].wait(timeout=240) == 0, log[-3000:]
    files = [os.path.basename(path) for path, _ in bench.produced_files(argv)]
    assert {"model.safetensors", "tokenizer.json", "tunesmith_config.json"} <= set(files)
    assert "merged 2 models by linear" in check_lines(bench.jobs["export"])


def test_runs_are_read_from_metrics_or_the_trainer_state(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "tunesmith_config.json").write_text(json.dumps({"PPOArguments": {"advantage": "grpo"}}))
    (old / "trainer_state.json").write_text(json.dumps({"log_history": [{"loss": 2.0, "step": 1}]}))
    [run] = runs.find_runs(str(tmp_path))
    assert run.stage == "grpo" and runs.row(run)[4:6] == [1, 2.0] and runs.status(run) == "incomplete"
    assert runs.stage_of({"SFTDataArguments": {}, "DistillArguments": {}}) == "distill"
    assert runs.stage_of({"PretrainDataArguments": {}, "FinetuningArguments": {}}) == "pt"
    assert train_flags(TrainForm(stage="pt", dataset="corpus.txt"))[0] == "pt"
