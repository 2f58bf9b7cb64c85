"""A command's events (utils/events.py), the structured output the web UI reads instead of printed text: the trainer's
progress, the report lines, the boundary's one-line error, and a page job that reads them back."""

from __future__ import annotations

import sys

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from tunesmith.boundary import entry_point
from tunesmith.errors import ConfigError
from tunesmith.train.callbacks import MetricsFileCallback
from tunesmith.utils.events import EVENTS_FILE_ENV, emit, read_events, report


def test_nothing_is_written_without_an_events_file(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(EVENTS_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    emit("check", text="x")
    report("exported a -> b")
    assert capsys.readouterr().out == "exported a -> b\n" and list(tmp_path.iterdir()) == []


def test_report_lines_and_the_boundarys_error_are_events(tmp_path, monkeypatch, capsys):
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(EVENTS_FILE_ENV, str(events))
    report("merged 2 models by linear -> out")

    def refuses(argv):
        raise ConfigError("--max_seq_length must be at least 8 tokens (got 0).")

    with pytest.raises(SystemExit) as stop:
        entry_point(refuses)([])
    assert stop.value.code == 2
    assert [(e["event"], e["text"]) for e in read_events(str(events))] == [
        ("check", "merged 2 models by linear -> out"),
        ("error", "tunesmith: config error: --max_seq_length must be at least 8 tokens (got 0).")]
    assert [e["text"] for e in read_events(str(events), "error")] == [
        "tunesmith: config error: --max_seq_length must be at least 8 tokens (got 0)."]
    events.write_text(events.read_text() + '{"event": "progr')  # a line being written is skipped
    assert len(read_events(str(events))) == 2


def test_the_metrics_callback_sends_the_step_of_max_steps(tmp_path, monkeypatch):
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(EVENTS_FILE_ENV, str(events))
    args = TrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True)
    state, control, callback = TrainerState(max_steps=3), TrainerControl(), MetricsFileCallback()
    callback.on_train_begin(args, state, control)
    for step in (1, 2, 3):
        state.global_step = step
        callback.on_step_end(args, state, control)
    progress = [(e["step"], e["max_steps"]) for e in read_events(str(events), "progress")]
    # at the start and at the last step always; in between at most once a second (a fast run: none)
    assert progress[0] == (0, 3) and progress[-1] == (3, 3) and len(progress) in (2, 3, 4)


def test_a_page_job_reads_its_own_events(tmp_path):
    pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[ui]')")
    from tunesmith.ui.actions import check_lines
    from tunesmith.ui.jobs import Job

    # The run's side written by hand (importing tunesmith in the child takes long): what emit() appends.
    script = (f"import json, os, sys\nf = open(os.environ[{EVENTS_FILE_ENV!r}], 'a')\n"
              "for e in ({'event': 'check', 'text': 'wrote x.gguf, checked'}, {'event': 'progress', 'step': 2, "
              "'max_steps': 5}, {'event': 'error', 'text': 'tunesmith: config error: sent'}):\n"
              "    f.write(json.dumps(e) + '\\n')\n"
              "print('tunesmith: config error: printed, not sent')\nsys.exit(2)\n")
    log = tmp_path / "logs" / "export.log"
    job = Job([sys.executable, "-c", script], str(log))
    assert job.wait(timeout=60) == 2, job.log()
    assert job.error() == "tunesmith: config error: sent"
    assert [(e["step"], e["max_steps"]) for e in job.events("progress")] == [(2, 5)]
    assert check_lines(job) == "wrote x.gguf, checked\ntunesmith: config error: sent"
    again = Job([sys.executable, "-c", "pass"], str(log))  # the next job in the same place starts with no events
    assert again.wait(timeout=60) == 0 and again.events() == [] and again.error() is None
