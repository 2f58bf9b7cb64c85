"""tunesmith's shipped lm-eval tasks (tunesmith/evaluation/tasks/): each loads by name through lm-eval's
TaskManager with all its documents, its scorers judge hand-written replies as tunesmith's own rules do,
the tool prompts are chatml_tools renders, the knowledge set is balanced and well formed, and the plain
`lm_eval` command runs a generating and a multiple-choice task from an unrelated directory."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunesmith.data.template import apply_chat_template_override, render_text

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "tunesmith" / "evaluation" / "tasks"
DOCS = {"tunesmith_identity": 14, "tunesmith_arithmetic": 60, "tunesmith_tool_calls": 30, "tunesmith_knowledge": 120,
        "tunesmith_shapes": 12}
# The package's copies of the demo's held-out files, which stay where the demo scripts read them.
COPIES = {"identity.jsonl": "identity_heldout.jsonl", "arithmetic.jsonl": "grpo_eval.jsonl",
          "tool_calls.jsonl": "tools_heldout.jsonl"}


def load_utils():
    """The tasks' utils.py, imported by its path as lm-eval imports it."""
    spec = importlib.util.spec_from_file_location("tunesmith_eval_task_utils", TASKS / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


utils = load_utils()


@pytest.fixture(scope="module")
def tasks() -> dict:
    from lm_eval.tasks import TaskManager

    loaded = TaskManager(include_path=str(TASKS)).load(["tunesmith", "tunesmith_shapes"])
    return {name: task for name, task in loaded["tasks"].items()}


def test_every_shipped_task_loads_by_name_with_all_its_documents(tasks):
    shipped = {path.stem for path in TASKS.glob("*.yaml")}
    assert shipped == {*DOCS, "tunesmith"}, "a new task YAML needs its document count in DOCS"
    assert {name: len(task.eval_docs) for name, task in tasks.items()} == DOCS


def test_the_copies_of_the_demo_files_are_the_demo_files():
    for copy, demo in COPIES.items():
        assert (TASKS / copy).read_bytes() == (ROOT / "data" / "demo" / demo).read_bytes(), (
            f"copy data/demo/{demo} to tunesmith/evaluation/tasks/{copy} again")


def test_the_shapes_pictures_are_the_vision_demos_held_out_pictures():
    held_out = [json.loads(line)["messages"][0]["content"][0]["image"]
                for line in (ROOT / "data" / "demo" / "vlm" / "eval.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (TASKS / "shapes.jsonl").read_text().splitlines()]
    assert [Path(r["image"]).name for r in rows] == [Path(image).name for image in held_out]
    for row, image in zip(rows, held_out):
        assert (TASKS / row["image"]).read_bytes() == (ROOT / "data" / "demo" / "vlm" / image).read_bytes()
        count, color, shape = Path(image).stem.split("_")
        assert (row["count"], row["color"], row["shape"]) == (int(count), color, shape)


def test_identity_counts_tunesmith_and_other_identities():
    assert utils.score_identity("I'm TuneSmith, an AI assistant, not ChatGPT.") == {"says_tunesmith": 1,
                                                                                   "other_identity": 0}
    assert utils.score_identity("I am SmolLM, trained by Hugging Face.") == {"says_tunesmith": 0, "other_identity": 1}
    assert utils.score_identity("我是通义千问。") == {"says_tunesmith": 0, "other_identity": 1}
    assert utils.score_identity("I am a helpful assistant.") == {"says_tunesmith": 0, "other_identity": 0}


def test_arithmetic_scores_as_the_grpo_reward_functions(tasks):
    doc = tasks["tunesmith_arithmetic"].eval_docs[0]
    assert doc["answer"] == "23" and doc["prompt"].startswith("Add 20 and 3.")
    score = utils.process_arithmetic
    assert score(doc, ["20 + 3 = 23.\nAnswer: 23"]) == {"exact_answer": 1.0, "answer_format": 1.0}
    assert score(doc, ["Answer: 24"]) == {"exact_answer": 0.0, "answer_format": 1.0}
    assert score(doc, ["Answer: 20 + 3 = 23"]) == {"exact_answer": 1.0, "answer_format": 0.0}
    assert score(doc, ["Answer: 23\nHope that helps!"]) == {"exact_answer": 0.0, "answer_format": 0.0}


def test_tool_calls_score_function_and_arguments(tasks):
    doc = tasks["tunesmith_tool_calls"].eval_docs[0]
    assert json.loads(doc["expected_call"]) == {"name": "get_weather", "arguments": {"city": "Munich"}}
    score = utils.process_tool_calls
    right = '<tool_call>{"name": "get_weather", "arguments": {"city": "Munich"}}</tool_call>'
    assert score(doc, [right]) == {"well_formed": 1, "right_function": 1, "right_arguments": 1}
    assert score(doc, [right.replace("Munich", "Berlin")]) == {"well_formed": 1, "right_function": 1,
                                                               "right_arguments": 0}
    assert score(doc, [right.replace("get_weather", "get_time")]) == {"well_formed": 1, "right_function": 0,
                                                                      "right_arguments": 0}
    assert score(doc, ['<tool_call>{"name": "get_weather", "arguments": "Munich"}</tool_call>']) == {
        "well_formed": 0, "right_function": 0, "right_arguments": 0}
    assert score(doc, ['<tool_call>{"name": "get_weather", "arguments": {"city": "Mun']) == {
        "well_formed": 0, "right_function": 0, "right_arguments": 0}


def test_the_tool_prompt_is_the_chatml_tools_render_and_ignores_lm_evals_chat_template(tasks, tokenizer):
    task = tasks["tunesmith_tool_calls"]
    row = json.loads((TASKS / "tool_calls.jsonl").read_text(encoding="utf-8").splitlines()[0])
    own = tokenizer.chat_template
    try:
        apply_chat_template_override(tokenizer, "chatml_tools")
        expected = render_text(tokenizer, row["messages"], add_generation_prompt=True, tools=row["tools"])
    finally:
        tokenizer.chat_template = own
    doc = task.eval_docs[0]
    assert doc["prompt"] == expected
    assert expected.endswith("Tell me the weather for Munich.<|im_end|>\n<|im_start|>assistant\n")
    assert "<tools>\n" + "".join(json.dumps(t) + "\n" for t in row["tools"]) + "</tools>" in expected

    def chat_template(messages, add_generation_prompt=True):
        return "TEMPLATED " + json.dumps(messages)

    for apply in (False, True):
        assert task.fewshot_context(doc, num_fewshot=0, apply_chat_template=apply, chat_template=chat_template) == (
            expected)
    with pytest.raises(ValueError, match=r"tunesmith_tool_calls takes no few-shot examples .*--num_fewshot 2"):
        task.fewshot_context(doc, num_fewshot=2)


def test_the_knowledge_set_is_balanced_and_well_formed():
    rows = [r.data for r in utils.read_rows("knowledge.jsonl")]
    assert len(rows) == 120 and len({r["question"] for r in rows}) == 120
    assert collections.Counter(r["answer"] for r in rows) == {0: 30, 1: 30, 2: 30, 3: 30}
    areas = collections.Counter(r["area"] for r in rows)
    assert areas == dict.fromkeys(["geography", "science", "history", "arithmetic", "language", "everyday"], 20)
    for row in rows:
        assert set(row) == {"area", "question", "choices", "answer"}, row
        assert row["question"].endswith("?") and row["question"] == row["question"].strip(), row
        choices = row["choices"]
        assert len(choices) == 4 and len(set(choices)) == 4, row
        assert all(isinstance(c, str) and c and c == c.strip() for c in choices), row
        assert isinstance(row["answer"], int) and 0 <= row["answer"] < 4, row


def test_a_malformed_data_row_names_its_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(utils, "HERE", tmp_path)
    (tmp_path / "identity.jsonl").write_text('{"prompt": "Who are you?"}\n{"prompt": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"identity\.jsonl:line 2: not valid JSON"):
        utils.load_identity()
    (tmp_path / "arithmetic.jsonl").write_text(json.dumps({"messages": [], "answer": "3"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"arithmetic\.jsonl:line 1: expected `prompt` \(a string\) or `messages`"):
        utils.load_arithmetic()
    (tmp_path / "tool_calls.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n",
                                               encoding="utf-8")
    with pytest.raises(ValueError, match=r"tool_calls\.jsonl:line 1: expected `tools` and `expected_call`"):
        utils.load_tool_calls()


def test_plain_lm_eval_runs_a_generating_and_a_multiple_choice_task_from_any_directory(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    lm_eval = Path(sys.executable).with_name("lm_eval")  # the command lm-eval installs beside this Python
    done = subprocess.run([str(lm_eval), "--model", "hf", "--model_args", f"pretrained={tiny_model_dir},dtype=float32",
                           "--device", "cpu", "--batch_size", "4", "--include_path", str(TASKS),
                           "--tasks", "tunesmith_tool_calls,tunesmith_knowledge", "--limit", "4",
                           "--output_path", "out"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    assert set(results["tunesmith_tool_calls"]) >= {"well_formed,none", "right_function,none",
                                                    "right_arguments,none"}
    assert set(results["tunesmith_knowledge"]) >= {"acc,none", "acc_norm,none"}
    assert 0 <= results["tunesmith_knowledge"]["acc,none"] <= 1
