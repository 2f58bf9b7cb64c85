"""A model or adapter folder with a file cut short, garbage bytes, a safetensors header that lies or a config that
is not JSON stops every load (training, inference) in one line naming the file and what to do, not a traceback
from safetensors or transformers."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from tests.cli.test_cli_errors import assert_one_line_error, cli, write_jsonl  # noqa: E402
from tunesmith.errors import PathError
from tunesmith.models.loader import inference_model_args, load_for_inference
from tunesmith.models.weights_check import file_problem


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def lying_header(path: Path) -> None:
    """The first tensor's shape doubled in the header, the bytes left as they were."""
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [2 * header[name]["shape"][0], *header[name]["shape"][1:]]
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + size:])


def not_json(path: Path) -> None:
    path.write_text('{"model_type": "llama", ')


DAMAGES = {"cut short": (truncate, "not a whole safetensors file"),
           "garbage": (garbage, "not a whole safetensors file"),
           "lying header": (lying_header, "not a whole safetensors file")}


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, tiny_model_dir) -> str:
    torch.manual_seed(1)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    path = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(path)
    return str(path)


def damaged_copy(folder: str, tmp_path: Path, name: str, damage) -> Path:
    copy = tmp_path / Path(folder).name
    shutil.copytree(folder, copy)
    damage(copy / name)
    return copy


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_model_weights_stop_the_load_naming_the_file(tiny_model_dir, tmp_path, damage):
    damage_file, problem = DAMAGES[damage]
    model = damaged_copy(tiny_model_dir, tmp_path, "model.safetensors", damage_file)
    with pytest.raises(PathError, match=rf"^--model_name_or_path {model}: {model}/model.safetensors: {problem} "
                                        r"\(.*\): re-download or re-export the model, or point --model_name_or_path"):
        load_for_inference(inference_model_args(str(model)))


def test_a_config_that_is_not_json_is_named(tiny_model_dir, tmp_path):
    model = damaged_copy(tiny_model_dir, tmp_path, "config.json", not_json)
    with pytest.raises(PathError, match=rf"^--model_name_or_path {model}: {model}/config.json: not valid JSON"):
        load_for_inference(inference_model_args(str(model)))


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_adapter_weights_stop_the_load_naming_the_file(tiny_model_dir, adapter_dir, tmp_path, damage):
    damage_file, problem = DAMAGES[damage]
    adapter = damaged_copy(adapter_dir, tmp_path, "adapter_model.safetensors", damage_file)
    with pytest.raises(PathError, match=rf"^--adapter_name_or_path {adapter}: {adapter}/adapter_model.safetensors: "
                                        rf"{problem} \(.*\): train or copy the adapter again"):
        load_for_inference(inference_model_args(tiny_model_dir, str(adapter)))


def test_whole_files_pass_and_a_torch_archive_is_checked_by_its_checksums(tiny_model_dir, tmp_path):
    assert file_problem(Path(tiny_model_dir) / "model.safetensors") is None
    archive = tmp_path / "optimizer.pt"
    torch.save({"state": torch.arange(1000.0)}, archive)
    assert file_problem(archive) is None
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of the tensor's data flipped: the zip's CRC no longer matches
    archive.write_bytes(bytes(data))
    assert file_problem(archive).startswith("corrupt (its member ")
    truncate(archive)
    assert file_problem(archive).startswith("not a whole torch archive")


def test_chat_and_training_on_a_model_cut_short_exit_with_one_line(tiny_model_dir, tmp_path):
    model = damaged_copy(tiny_model_dir, tmp_path, "model.safetensors", truncate)
    weights = f"{model}/model.safetensors: not a whole safetensors file"
    assert_one_line_error(cli("chat/cli.py", "--model_name_or_path", str(model), cwd=tmp_path), weights)
    data = write_jsonl(tmp_path / "data.jsonl")
    proc = cli("sft/train.py", "--model_name_or_path", str(model), "--data_path", data, "--output_dir",
               str(tmp_path / "out"), "--max_steps", "1", cwd=tmp_path)
    assert_one_line_error(proc, weights, "re-download or re-export the model")


def test_an_adapter_config_that_is_not_json_is_one_line(adapter_dir, tmp_path):
    adapter = damaged_copy(adapter_dir, tmp_path, "adapter_config.json", not_json)
    proc = cli("chat/cli.py", "--model_name_or_path", str(adapter), cwd=tmp_path)
    assert_one_line_error(proc, f"{adapter}/adapter_config.json: not valid JSON", "train or copy the adapter again")
