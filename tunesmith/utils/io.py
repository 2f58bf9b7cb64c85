"""Atomic writes: a reader (or a killed run) never sees half a file; and a save that fills the disk stops in
one line, leaving the last complete save in place."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import PathError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# torch's and safetensors' writers report a full disk in their own words ("unexpected pos 576 vs 534", "I/O
# error: No space left on device"), with no errno; a write that ran out of room leaves less than this free.
NEARLY_FULL_BYTES = 1 << 20


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """The mode a rewritten file keeps: its own where it exists, else what open() would give a new one (mkstemp
    makes its file 0600, which would leave a rewritten or new file readable by its owner alone)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read where Linux shows it; elsewhere set and put back (a moment in which another
    thread's new file would get no umask, hence not the first choice)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def atomic_write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling folder that becomes `path` only if the block finishes; a failure leaves
    neither it nor a half-written `path` behind (an existing `path` is kept until the swap)."""
    target = Path(path).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)
        yield tmp
        replace_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_directory(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Move the finished folder `source` to `target` (a sibling), replacing what is there: an existing
    `target` is moved aside first and deleted only after the rename, so `target` is at every moment
    either the old folder or the new one, never a mix."""
    source, target = Path(source), Path(target)
    if target.is_dir() and any(target.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.replace(target, old / target.name)
        os.replace(source, target)
        shutil.rmtree(old)
    else:
        if target.is_dir():
            target.rmdir()
        os.replace(source, target)


def publish_files(staging: str | os.PathLike, target: str | os.PathLike) -> None:
    """Move each file and folder of the finished folder `staging` into `target` (each replacing its namesake
    with one rename, folders through replace_directory), then remove `staging`: a reader of `target` sees each
    file whole, old or new. Other files in `target` (checkpoints, logs) stay."""
    staging, target = Path(staging), Path(target)
    for entry in sorted(staging.iterdir()):
        if entry.is_dir():
            replace_directory(entry, target / entry.name)
        else:
            os.replace(entry, target / entry.name)
    staging.rmdir()


# ---------------------------------------------------------------------------- a full disk


def free_bytes(path: str | os.PathLike) -> int:
    """Free space for this user on the file system of `path` (or of its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def folder_bytes(folder: str | os.PathLike | None) -> int:
    """The size of the files in `folder` and its subfolders (0 when there is none)."""
    if folder is None or not Path(folder).is_dir():
        return 0
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def ran_out_of_space(error: BaseException, path: str | os.PathLike) -> bool:
    """Whether `error`, raised while writing under `path`, is the disk filling up: an OSError saying so
    anywhere in its chain, or any error while under a megabyte is left there (each writer says it in its own
    type and words: torch a RuntimeError, safetensors a SafetensorError, tokenizers a bare Exception)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in DISK_FULL_ERRNOS:
            return True
        seen = seen.__cause__ or seen.__context__
    return free_bytes(path) < NEARLY_FULL_BYTES


def human_bytes(n: int) -> str:
    from tqdm import tqdm

    return tqdm.format_sizeof(n, "B", 1000)  # 4.00MB, as transformers' progress bars write sizes


@contextmanager
def stop_when_disk_fills(folder: str | os.PathLike, needed: int = 0, discard: bool = False) -> Iterator[None]:
    """A save into `folder` that fills the disk becomes one PathError naming the folder, the space the save
    needs (`needed`, an estimate from an earlier save of the same kind, or at least what was written) and the
    space left. discard: remove the partial `folder` first (a staging folder, or a checkpoint cut short that no
    resume would read), so that the space it took is free again. Any other error goes on unchanged."""
    try:
        yield
    except Exception as e:
        stop = disk_full_error(e, folder, needed, discard)
        if stop is None:
            raise
        raise stop from e


def disk_full_error(error: Exception, folder: str | os.PathLike, needed: int = 0,
                    discard: bool = False) -> PathError | None:
    """stop_when_disk_fills' error for `error` raised while saving into `folder`, or None when the disk is not
    full (the caller raises `error` as it is)."""
    if not ran_out_of_space(error, folder):
        return None
    written = folder_bytes(folder)
    if discard:
        shutil.rmtree(folder, ignore_errors=True)
    need = f"about {human_bytes(needed)}" if needed > written else f"more than the {human_bytes(written)} written"
    return PathError(f"{folder}: the disk filled up while saving (the save needs {need}, "
                     f"{human_bytes(free_bytes(folder))} is free there): free space and run the same command again; "
                     "the last complete save is kept, and training resumes from its last complete checkpoint")
