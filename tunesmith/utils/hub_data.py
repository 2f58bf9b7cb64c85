"""A dataset on the Hugging Face Hub named where a data file goes: `--data_path org/name`, `org/name:split` or
`org/name:subset:split` (`--data_revision` pins a branch, tag or commit). Its files are fetched with
huggingface_hub's snapshot_download into the Hugging Face cache (HF_HOME; HF_TOKEN for private and gated datasets)
and the entry is replaced by a local path, so every reader, mask and check after that is a local file's. With
HF_HUB_OFFLINE=1 a dataset already in the cache (`hf download --repo-type dataset org/name` on a login node) loads
from there by its id, which snapshot_download resolves offline; datasets.load_dataset does not, as it wants its own
processed cache.

Which files are a subset's split is decided as `datasets` decides it: the subsets (configs) and their data_files
patterns of the dataset card's YAML (README.md), else the split names in the file and folder names
(datasets.data_files.get_data_patterns). Only that split's files are fetched where the card names them; a
repository without configs is one subset, and all its data files come (its other splits are rarely large).

A split of one file is that file; several files, in datasets' order, are either a folder's every data file (the
folder itself) or a folder of links to them under tunesmith's cache (utils/paths.cache_root), which the readers
take as a folder of shards."""

from __future__ import annotations

import logging
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, PathError
from .paths import SHARD_SUFFIXES, cache_root, looks_local, problem_with_data_file, shard_files

logger = logging.getLogger(__name__)

# The fields whose entries may be hub ids: every command's data files, and PPO-ptx's.
HUB_DATA_FIELDS = ("data_path", "eval_data_path", "ptx_data_path")
# What tunesmith reads (data/formats.py, data/text_documents.py); a plain-text split is read by `tunesmith pt`.
READ_SUFFIXES = (*SHARD_SUFFIXES, ".txt")
CARD = "README.md"
DEFAULT_SPLIT = "train"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_NAME = re.compile(r"^[\w.-]+$")


@dataclass(frozen=True)
class HubDataset:
    """One hub data entry as written: the repository, and the subset and split when named."""

    repo: str
    subset: str | None = None
    split: str | None = None

    @classmethod
    def parse(cls, text: str) -> HubDataset | None:
        """The entry `org/name[:split]` or `org/name:subset:split`; None when it is not one (a local path)."""
        if os.path.exists(text):
            return None
        repo, *parts = text.split(":")
        if not _REPO_ID.match(repo) or looks_local(repo) or len(parts) > 2 or not all(_NAME.match(p) for p in parts):
            return None
        if not parts and repo.lower().endswith(DATA_FILE_SUFFIXES):  # `no/such.jsonl`: a missing file, not a dataset
            return None
        subset, split = parts if len(parts) == 2 else (None, parts[0] if parts else None)
        return cls(repo, subset, split)

    def __str__(self) -> str:
        return ":".join(p for p in (self.repo, self.subset, self.split) if p)


# A name ending like a data file names a file (a missing one), not a dataset repository.
DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow")


def is_hub_dataset(text: str) -> bool:
    return HubDataset.parse(text) is not None


def problem_with_data_source(path: str) -> str | None:
    """Why `path` cannot be read as a data file, or None; a hub id is not checked here (fetching it is: the run
    resolves it after the rules, resolve_hub_data)."""
    return None if is_hub_dataset(path) else problem_with_data_file(path)


def resolve_hub_data(*configs: object) -> None:
    """Replace every hub id among the configs' data files (HUB_DATA_FIELDS) by the local file or folder of its
    split, fetched (or found in the cache) at --data_revision."""
    revision = next((c.data_revision for c in configs if getattr(c, "data_revision", None)), None)
    for config in configs:
        for name in HUB_DATA_FIELDS:
            paths = getattr(config, name, None)
            if isinstance(paths, list) and any(map(is_hub_dataset, paths)):
                setattr(config, name, [local_split(p, revision) if is_hub_dataset(p) else p for p in paths])


def local_split(text: str, revision: str | None = None) -> str:
    """The local path of the hub dataset entry `text` (see the module's docstring)."""
    entry = HubDataset.parse(text)
    assert entry is not None, text
    card_folder = _snapshot(entry, text, revision, [CARD])
    configs = _configs(Path(card_folder) / CARD)
    subset = _subset(entry, text, configs)
    if configs:
        config = configs[subset]
        data_dir = config.get("data_dir") or ""
        listed = config.get("data_files")
        allow = ([f"{data_dir}/*"] if data_dir else None) if listed is None else _card_patterns(listed, data_dir)
    else:
        config, data_dir, allow = {}, "", None
    commit = Path(card_folder).name  # the files come from the commit the card came from
    folder = Path(_snapshot(entry, text, commit, allow or [f"*{suffix}" for suffix in READ_SUFFIXES]))
    splits = _split_files(folder / data_dir, config.get("data_files"))
    split = entry.split or (DEFAULT_SPLIT if DEFAULT_SPLIT in splits or len(splits) != 1 else next(iter(splits)))
    if split not in splits:
        where = f" of subset {subset}" if configs and len(configs) > 1 else ""
        raise PathError(f"--data_path {text}: the dataset has no split {split!r}{where}; its splits: "
                        f"{', '.join(splits) or 'none with data files'} (write {entry.repo}:SPLIT"
                        f"{' or ' + entry.repo + ':SUBSET:SPLIT' if configs and len(configs) > 1 else ''})")
    files = [Path(f) for f in splits[split]]
    unread = [f for f in files if f.suffix not in READ_SUFFIXES]
    if unread or not files:
        raise PathError(f"--data_path {text}: split {split} is held in files tunesmith does not read "
                        f"({', '.join(sorted({''.join(f.suffixes) for f in unread})) or 'none'}, e.g. "
                        f"{unread[0].relative_to(folder) if unread else '-'}); it reads JSON, JSONL, Parquet and "
                        "Arrow: convert the files, or try --data_revision refs/convert/parquet (the Hub's Parquet copy)")
    local = _one_source(files, entry, folder, subset, split)
    problem = problem_with_data_file(local)
    if problem:
        raise PathError(f"--data_path {text}: {local} {problem}")
    logger.info("--data_path %s: %d file%s of %s (revision %s) in %s", text, len(files), "s" * (len(files) > 1),
                entry.repo, folder.name, local)
    return local


def _snapshot(entry: HubDataset, text: str, revision: str | None, allow: list[str]) -> str:
    """snapshot_download of the files matching `allow`: the snapshot folder, or one line saying why not."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    neither = f"--data_path {text}: no such file here, and"
    try:
        return snapshot_download(entry.repo, repo_type="dataset", revision=revision, allow_patterns=allow)
    except IncompleteSnapshotError as e:
        if allow == [CARD]:  # a download without the card (hf download --include 'data/*'): read the files as they are
            return e.snapshot_path
        raise PathError(f"--data_path {text}: the Hugging Face cache holds only part of it ({constants.HF_HUB_CACHE}) and "
                        f"the Hub is not reachable: download it where it is (hf download --repo-type dataset "
                        f"{entry.repo}), or unset HF_HUB_OFFLINE") from None
    except GatedRepoError:
        raise PathError(f"{neither} the dataset {entry.repo} on the Hugging Face Hub is gated: accept its terms on "
                        f"https://huggingface.co/datasets/{entry.repo} and set HF_TOKEN (or run hf auth login)") from None
    except RepositoryNotFoundError:
        raise PathError(f"{neither} the Hugging Face Hub has no dataset {entry.repo} (or it is private: set "
                        "HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise PathError(f"--data_path {text}: the dataset {entry.repo} has no revision {revision!r} "
                        "(--data_revision: a branch, tag or commit)") from None
    except LocalEntryNotFoundError:
        offline = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hugging Face Hub is not reachable"
        at = f" at revision {revision}" if revision else ""
        raise PathError(f"{neither} the dataset {entry.repo}{at} is not in the Hugging Face cache "
                        f"({constants.HF_HUB_CACHE}) and {offline}: download it first (hf download --repo-type "
                        f"dataset {entry.repo}), or give a local file") from None


def _configs(card: Path) -> dict[str, dict]:
    """The subsets the dataset card's YAML declares ({name: its settings}), {} when it declares none."""
    if not card.is_file():
        return {}
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub.repocard import metadata_load

    try:
        return dict(MetadataConfigs.from_dataset_card_data(metadata_load(card) or {}))
    except Exception as e:  # yaml's and datasets' own errors for a card that is not what they expect
        raise PathError(f"{card}: the dataset card's YAML cannot be read as datasets reads it ({e})") from None


def _subset(entry: HubDataset, text: str, configs: dict[str, dict]) -> str | None:
    if not configs:
        if entry.subset:
            raise PathError(f"--data_path {text}: the dataset declares no subsets; write {entry.repo}:SPLIT")
        return None
    from datasets.utils.metadata import MetadataConfigs

    try:
        default = MetadataConfigs(configs).get_default_config_name()
    except ValueError:  # several marked default
        default = None
    subset = entry.subset or default
    if subset not in configs:
        asked = f"has no subset {subset!r}" if subset else "has several subsets"
        raise PathError(f"--data_path {text}: the dataset {asked}: {', '.join(configs)}; name one as "
                        f"{entry.repo}:SUBSET:SPLIT (e.g. {entry.repo}:{next(iter(configs))}:{DEFAULT_SPLIT})")
    return subset


def _card_patterns(listed: str | list, data_dir: str) -> list[str]:
    """The data_files patterns of a subset, as snapshot_download's allow_patterns (relative to the repository)."""
    from datasets.data_files import sanitize_patterns

    prefix = f"{data_dir.strip('/')}/" if data_dir else ""
    return [prefix + p for patterns in sanitize_patterns(listed).values() for p in patterns]


def _split_files(base: Path, listed: str | list | None) -> dict[str, list[str]]:
    """{split: its files, in datasets' order} of the snapshot folder `base`."""
    from datasets.data_files import DataFilesDict, EmptyDatasetError, get_data_patterns, sanitize_patterns

    try:
        patterns = sanitize_patterns(listed) if listed is not None else get_data_patterns(str(base))
        return {str(k): list(v) for k, v in DataFilesDict.from_patterns(patterns, base_path=str(base)).items()}
    except (EmptyDatasetError, FileNotFoundError):
        return {}


def _one_source(files: list[Path], entry: HubDataset, folder: Path, subset: str | None, split: str) -> str:
    """One path the readers take for the split's files: the file, their folder when they are all of its data
    files, else a folder of links to them (made once, atomically: every rank of a launch resolves the same)."""
    if len(files) == 1:
        return str(files[0])
    if [str(f) for f in files] == shard_files(str(files[0].parent)):
        return str(files[0].parent)
    if any(f.suffix not in SHARD_SUFFIXES for f in files):
        raise ConfigError(f"--data_path {entry}: split {split} is {len(files)} text files; tunesmith pt reads one "
                          "text file, or rows with a `text` field in JSON, JSONL or Parquet files")
    links = cache_root() / "hub" / entry.repo.replace("/", "--") / folder.name / f"{subset or 'default'}--{split}"
    if not links.is_dir():
        building = links.with_name(f"{links.name}.{uuid.uuid4().hex}")
        building.mkdir(parents=True)
        for i, f in enumerate(files):  # numbered: the folder's name order is datasets' order
            (building / f"{i:05d}-{f.name}").symlink_to(f)
        try:
            building.rename(links)
        except OSError:  # another process made it first
            for link in building.iterdir():
                link.unlink()
            building.rmdir()
    return str(links)
