"""Whether the files a load or a resume reads are whole, checked before a library reads them so that a file
cut short (a copy or a download interrupted, a full disk), garbage bytes or a safetensors header that lies
stops in one line naming the file, instead of a traceback from deep inside safetensors, torch or
transformers. Each check is the file format's own and cheap next to the load:
- safetensors: safetensors' safe_open parses the header and checks that the tensors' offsets cover the
  file exactly (a file cut short, or a header whose shapes do not match its offsets, fails); no tensor is read;
- JSON: parsed;
- torch archives (optimizer.pt, rng_state.pth, ...; torch.save writes a zip): zipfile's CRC check of every
  member, which reads the bytes but unpickles nothing."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

from ..errors import PathError

TORCH_ARCHIVE_SUFFIXES = (".pt", ".pth", ".bin")
MODEL_REMEDY = "re-download or re-export the model, or point --model_name_or_path at another folder"
ADAPTER_REMEDY = "train or copy the adapter again, or point --adapter_name_or_path at another folder"


def file_problem(path: str | os.PathLike, archives: bool = True) -> str | None:
    """What is wrong with one safetensors, JSON or (with `archives`) torch archive file, or None when it reads
    (other kinds of file are not checked)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt"):
                pass
        elif path.suffix == ".json":
            json.loads(path.read_bytes())
        elif archives and path.suffix in TORCH_ARCHIVE_SUFFIXES and not _legacy_pickle(path):
            with zipfile.ZipFile(path) as archive:
                damaged = archive.testzip()
            if damaged is not None:
                return f"corrupt (its member {damaged} fails its checksum)"
    except SafetensorError as e:
        return f"not a whole safetensors file ({e})"
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"not valid JSON ({e})"
    except (zipfile.BadZipFile, EOFError) as e:
        return f"not a whole torch archive ({e})"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None


def _legacy_pickle(path: Path) -> bool:
    """torch.save's format before torch 1.6 (a bare pickle, which old hub models' pytorch_model.bin can be): it
    has no checksums to test, and is left to the loader."""
    with path.open("rb") as f:
        return f.read(1) == b"\x80"


def folder_problems(folder: str | os.PathLike, recursive: bool = False, archives: bool = True) -> list[str]:
    """'<file>: <what is wrong>' for each checked file in `folder` (and its subfolders when recursive) that
    does not read, in name order."""
    files = Path(folder).rglob("*") if recursive else Path(folder).iterdir()
    problems = []
    for path in sorted(files):
        problem = file_problem(path, archives) if path.is_file() else None
        if problem:
            problems.append(f"{path}: {problem}")
    return problems


def check_model_folder(folder: str | None, flag: str = "--model_name_or_path", remedy: str = MODEL_REMEDY) -> None:
    """PathError naming the first file of a local model or adapter folder (its configs, tokenizer files and
    safetensors weights) that does not read, and what to do. A hub id or a missing folder is left to the loader.
    Torch archives are left out: a model's pytorch_model.bin can be gigabytes, and its checksums would be read at
    every load."""
    if not folder or not os.path.isdir(folder):
        return
    problems = folder_problems(folder, archives=False)
    if problems:
        raise PathError(f"{flag} {folder}: {problems[0]}: {remedy}")


def check_adapter_folder(folder: str | None, flag: str = "--adapter_name_or_path") -> None:
    check_model_folder(folder, flag, ADAPTER_REMEDY)


def check_load_folders(model_args: Any) -> None:
    """The model's and the adapter's folders (ModelArguments' model_name_or_path, adapter_name_or_path) before a
    load reads them."""
    check_model_folder(model_args.model_name_or_path)
    check_adapter_folder(model_args.adapter_name_or_path)
