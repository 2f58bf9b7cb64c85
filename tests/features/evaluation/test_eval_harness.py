"""`tunesmith eval`: lm-evaluation-harness in process on our models. Its numbers and results file must
be lm_eval's own (the `lm_eval` command is run beside it on the same model and tasks), --compare_to
must pair the two models' per-document scores, and bad task names or unreachable data stop with one
line before any model loads."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.tiny_models import save_random_adapter

ROOT = Path(__file__).resolve().parents[3]
TASKS = str(ROOT / "tests" / "data" / "lm_eval_tasks" / "tiny_mc")
LM_EVAL = str(Path(sys.executable).with_name("lm_eval"))


@pytest.fixture(scope="module")
def adapter_dir(chatty_model_dir, tokenizer, tmp_path_factory) -> str:
    return save_random_adapter(chatty_model_dir, tokenizer, str(tmp_path_factory.mktemp("eval-adapter")), seed=3)


def results_file(out: Path) -> Path:
    (found,) = out.glob("*/results_*.json")
    return found


def test_tunesmith_eval_writes_what_lm_eval_writes_for_the_same_model_and_tasks(
        tmp_path, chatty_model_dir, adapter_dir, capsys):
    from tunesmith.evaluation import command as evaluation

    settings = ["--include_path", TASKS, "--tasks", "tunesmith_tiny_mc,tunesmith_tiny_gen", "--limit", "12",
                "--batch_size", "4"]
    theirs = subprocess.run([LM_EVAL, "--model", "hf", "--model_args", f"pretrained={chatty_model_dir},peft={adapter_dir}",
                             "--device", "cpu", "--output_path", str(tmp_path / "theirs"), *settings],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)  # the task's data path is relative
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    evaluation.run(["--model_name_or_path", chatty_model_dir, "--adapter_name_or_path", adapter_dir,
                    "--output_path", str(tmp_path / "ours"), *settings])

    ours_file, theirs_file = results_file(tmp_path / "ours"), results_file(tmp_path / "theirs")
    # the same place: <output_path>/<model name as lm-eval sanitizes it>/results_<time>.json
    assert ours_file.parent.name == theirs_file.parent.name
    ours, theirs_json = json.loads(ours_file.read_text()), json.loads(theirs_file.read_text())
    assert ours["results"].keys() == theirs_json["results"].keys() == {"tunesmith_tiny_mc", "tunesmith_tiny_gen"}
    for task, metrics in theirs_json["results"].items():
        for key, value in metrics.items():
            if isinstance(value, float):
                assert math.isclose(ours["results"][task][key], value, abs_tol=1e-9), (task, key)
            else:
                assert ours["results"][task][key] == value, (task, key)
    assert ours["n-samples"] == theirs_json["n-samples"] and ours["configs"].keys() == theirs_json["configs"].keys()
    # the model must make a difference here, else equal numbers would prove nothing
    assert 0 < theirs_json["results"]["tunesmith_tiny_mc"]["acc,none"] < 1
    printed = capsys.readouterr().out
    assert "|tunesmith_tiny_mc |" in printed and str(ours_file) in printed  # lm-eval's own table, and the file


def test_compare_to_base_pairs_the_documents_and_reports_the_change_with_its_standard_error(
        tmp_path, chatty_model_dir, adapter_dir, capsys):
    from tunesmith.evaluation import command as evaluation

    out = tmp_path / "cmp"
    rows = evaluation.run(["--model_name_or_path", chatty_model_dir, "--adapter_name_or_path", adapter_dir,
                           "--include_path", TASKS, "--tasks", "tunesmith_tiny_mc", "--limit", "20", "--batch_size", "8",
                           "--compare_to", "base", "--log_samples", "--output_path", str(out)])
    # Recompute from lm-eval's own samples files: each document's accuracy under each model.
    per_doc = {}
    for folder in out.iterdir():
        if folder.is_dir():
            (samples,) = folder.glob("samples_tunesmith_tiny_mc_*.jsonl")
            per_doc[folder.name] = {r["doc_id"]: r["acc"] for r in map(json.loads, samples.read_text().splitlines())}
    (base_name,) = [name for name in per_doc if name.endswith(Path(chatty_model_dir).name)]
    (tuned_name,) = [name for name in per_doc if name.endswith(Path(adapter_dir).name)]
    base, tuned = per_doc[base_name], per_doc[tuned_name]
    assert base.keys() == tuned.keys() and len(base) == 20
    diffs = [tuned[i] - base[i] for i in base]
    mean = sum(diffs) / 20
    stderr = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 19 / 20)
    assert any(diffs), "the adapter must change some answers for this test to mean anything"

    (row,) = rows
    assert row["task"] == "tunesmith_tiny_mc" and row["metric"] == "acc" and row["n"] == 20
    assert row["base"] == pytest.approx(sum(base.values()) / 20) and row["tuned"] == pytest.approx(sum(tuned.values()) / 20)
    assert row["change"] == pytest.approx(mean) and row["change_stderr"] == pytest.approx(stderr)
    saved = json.loads((out / "compare.json").read_text())
    assert saved["rows"] == rows and saved["base"]["label"] == "base"
    assert (out / "compare.md").read_text().count("| tunesmith_tiny_mc | acc ↑ | 20 |") == 1
    printed = capsys.readouterr().out
    assert f"{mean:+.4f} | {stderr:.4f} |" in printed


def test_the_paired_comparison_pairs_mean_metrics_only_and_documents_in_both_runs():
    from tunesmith.evaluation.paired import compare_runs

    def run(acc: list[float], ppl: float, docs: range) -> dict:
        samples = [{"doc_id": i, "filter": "none", "metrics": ["acc", "ppl"], "acc": a, "ppl": 1.0}
                   for i, a in zip(docs, acc)]
        return {"results": {"t": {"acc,none": sum(acc) / len(acc), "acc_stderr,none": 0.1, "ppl,none": ppl,
                                  "alias": "t"}},
                "samples": {"t": samples}, "higher_is_better": {"t": {"acc": True, "ppl": False}}}

    rows = {r["metric"]: r for r in compare_runs(run([0, 1, 0, 1], 9.0, range(4)), run([1, 1, 1, 1], 7.5, range(4)))}
    assert rows.keys() == {"acc", "ppl"}
    assert rows["acc"]["change"] == 0.5 and rows["acc"]["n"] == 4
    assert rows["acc"]["change_stderr"] == pytest.approx(math.sqrt(1 / 3) / 2)  # diffs 1,0,1,0: sd sqrt(1/3)
    # perplexity is not the mean of its per-document values: no pairing, no standard error
    assert rows["ppl"]["change"] == -1.5 and rows["ppl"]["change_stderr"] is None and rows["ppl"]["n"] is None
    assert rows["ppl"]["higher_is_better"] is False


def test_unknown_tasks_and_unreachable_data_stop_with_one_line_before_a_model_loads(tiny_model_dir):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # conftest: as on a machine without hub access
    proc = subprocess.run([sys.executable, "-m", "tunesmith", "eval", "--model_name_or_path", tiny_model_dir,
                           "--tasks", "arc_eazy"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no lm-eval task or group named 'arc_eazy' (did you mean arc_easy" in proc.stderr.strip().splitlines()[-1]

    from tunesmith.errors import DataError
    from tunesmith.evaluation.harness import check_tasks, task_manager

    with pytest.raises(DataError, match=r"--tasks arc_easy: its data \(allenai/ai2_arc\) could not be loaded: .*"
                                        r"--include_path"):
        check_tasks(task_manager(None), ["arc_easy"])


def test_without_lm_eval_the_command_says_which_extra_to_install(tiny_model_dir, monkeypatch, capsys):
    from tunesmith.evaluation.command import main

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as after `pip install tunesmith`, without the eval extra
    with pytest.raises(SystemExit) as stopped:
        main(["--model_name_or_path", tiny_model_dir, "--tasks", "tunesmith_identity"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1
    assert "tunesmith eval --tasks runs lm-evaluation-harness, which is not installed: pip install 'tunesmith[eval]'" in err


@pytest.mark.slow
@pytest.mark.heavy  # the real model over every shipped task (~2.5 min loaded); -m heavy
def test_the_embedded_default_model_knows_its_facts_well_above_chance(tmp_path):
    """No model given: the embedded SmolLM2-135M-Instruct. On the shipped knowledge set (4 choices, chance
    0.25) it scores about 0.57 in full; a broken prompt, scoring or model load would fall to chance."""
    from tunesmith.evaluation import command as evaluation

    results = evaluation.run(["--tasks", "tunesmith_knowledge", "--limit", "40", "--apply_chat_template",
                              "--output_path", str(tmp_path)])
    assert results["results"]["tunesmith_knowledge"]["acc,none"] >= 0.45
    assert "SmolLM2-135M-Instruct" in results_file(tmp_path).parent.name
