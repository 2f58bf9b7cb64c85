"""`tunesmith eval` on a vision-language model: lm-eval's hf-multimodal model on the shipped picture task
(`tunesmith_shapes`), its replies and numbers those of the `lm_eval --model hf-multimodal` command on the same tiny
Idefics3 (whose processor loads without torchvision); the Qwen2-VL path runs through tunesmith's own processor."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.vlm_models import build_vlm_dir
from tunesmith.evaluation.harness import TASKS_DIR

ROOT = Path(__file__).resolve().parents[3]
LM_EVAL = str(Path(sys.executable).with_name("lm_eval"))
SETTINGS = ["--tasks", "tunesmith_shapes", "--limit", "4", "--batch_size", "2", "--apply_chat_template",
            "--log_samples"]


def replies(out: Path) -> list[str]:
    (samples,) = out.glob("*/samples_tunesmith_shapes_*.jsonl")
    return [json.loads(line)["resps"][0][0] for line in samples.read_text().splitlines()]


def results(out: Path) -> dict:
    (found,) = out.glob("*/results_*.json")
    return json.loads(found.read_text())["results"]["tunesmith_shapes"]


@pytest.mark.heavy  # the real model with lm-eval twice (~1.7 min loaded); -m heavy
def test_tunesmith_eval_answers_the_picture_task_as_lm_eval_does(tmp_path, default_model_path):
    from tunesmith.evaluation import command as evaluation

    model_dir = build_vlm_dir("idefics3", tmp_path / "idefics3", default_model_path, seed=2)
    theirs = subprocess.run([LM_EVAL, "--model", "hf-multimodal", "--model_args", f"pretrained={model_dir}",
                             "--include_path", str(TASKS_DIR), "--device", "cpu", "--output_path",
                             str(tmp_path / "theirs"), *SETTINGS], capture_output=True, text=True, timeout=600)
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    evaluation.run(["--model_name_or_path", model_dir, "--dtype", "float32", "--output_path", str(tmp_path / "ours"),
                    *SETTINGS])
    ours_replies, their_replies = replies(tmp_path / "ours"), replies(tmp_path / "theirs")
    assert len(ours_replies) == 4 and ours_replies == their_replies
    assert len(set(their_replies)) > 1  # the pictures make the replies differ: equal lists would otherwise prove little
    assert results(tmp_path / "ours")["right_count,none"] == results(tmp_path / "theirs")["right_count,none"]


def test_a_qwen2_vl_model_is_evaluated_with_tunesmiths_processor(tmp_path, default_model_path):
    from tunesmith.evaluation import command as evaluation

    model_dir = build_vlm_dir("qwen2_vl", tmp_path / "qwen2_vl", default_model_path, seed=2)
    evaluation.run(["--model_name_or_path", model_dir, "--output_path", str(tmp_path / "ours"), *SETTINGS])
    assert len(replies(tmp_path / "ours")) == 4
    assert 0.0 <= results(tmp_path / "ours")["right_count,none"] <= 1.0


@pytest.mark.parametrize("reply, right", [("Three.", True), ("3 shapes", True), ("There are two.", False),
                                          ("I see none", False)])
def test_the_shapes_task_reads_the_first_count_of_a_reply(reply, right):
    spec = importlib.util.spec_from_file_location("shipped_task_utils", TASKS_DIR / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    assert utils.process_shapes({"count": 3}, [reply]) == {"right_count": float(right)}
