"""Which rows of the --data_path files a stage uses: --data_split, DeepSpeed-Chat's split of one dataset
across the three stages, and --data_weights, how many rows each file gives the mix. Both depend only on
the files, the flags and the seed, never on a stage's other settings, so every stage computes the same
parts, and the tokenized-data cache is keyed by them (RowSelection.key).

--data_split 2,4,4: each file's rows (every row, bad ones included, so that a row one stage cannot parse
moves no boundary) are shuffled as DeepSpeed-Chat's get_raw_dataset_split_index shuffles them
(numpy.random.RandomState(seed).shuffle of 0..n-1) and cut at its boundaries (each share of n rounded,
the rounding error taken from the first part): the same rows as DeepSpeed-Chat for the same seed. A
part keeps the file's order.

--data_weights 0.7,0.3: N rows in all (the files' good rows together, or --max_samples), file i giving
N * w_i / sum(w), rounded so the counts add up to N. A file asked for fewer rows than it has gives a
seeded sample of them; asked for more, every row as many whole times as fit, then a seeded sample
for the rest (repeats as even as they can be, as LLaMA-Factory's interleave_under/over and axolotl's
weighted mixing oversample)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ..errors import DataError
from ..hparams.data_args import SPLIT_STAGES, numbers

T = TypeVar("T")


def split_bounds(size: int, shares: Sequence[float]) -> list[int]:
    """Where each part begins and ends among `size` shuffled rows: [0, b1, b2, size]."""
    total = float(sum(shares))
    bounds = [0]
    for share in shares:
        bounds.append(bounds[-1] + int(round(share / total * size)))
    excess = bounds[-1] - size  # the rounding error, taken from the first part as DeepSpeed-Chat does
    return [0] + [max(0, b - excess) for b in bounds[1:]]


def split_part(size: int, shares: Sequence[float], part: int, seed: int) -> list[int]:
    """The row indices (ascending) of part `part` (1-based) of `size` rows."""
    order = np.arange(size, dtype=np.int64)
    np.random.RandomState(seed).shuffle(order)
    bounds = split_bounds(size, shares)
    return sorted(int(i) for i in order[bounds[part - 1]: bounds[part]])


def mixed_counts(sizes: Sequence[int], weights: Sequence[float], total: int) -> list[int]:
    """How many rows each file gives: total in proportion to the weights, the rounding left to the
    largest remainders (ties to the earlier file)."""
    exact = [total * w / sum(weights) for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def draw(size: int, count: int, rng: np.random.Generator) -> list[int]:
    """`count` indices of `size` rows: every row as many whole times as fit, then a sample of the rest."""
    whole, rest = divmod(count, size)
    return list(range(size)) * whole + sorted(int(i) for i in rng.choice(size, rest, replace=False))


@dataclass
class RowSelection:
    """A stage's --data_split part and --data_weights, with the seed; `notes` collects what it did, for
    the log (and the cache, which reports it again on a hit)."""

    split: list[str] = field(default_factory=list)  # as given: "2", "4", "4"
    part: int = 0  # the stage's part, 1-based; 0: no split
    weights: list[str] = field(default_factory=list)
    seed: int = 42
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, data_args: Any, seed: int) -> RowSelection | None:
        """The selection --data_split and --data_weights ask for, or None when neither is given."""
        split, weights = list(getattr(data_args, "data_split", [])), list(getattr(data_args, "data_weights", []))
        if not (split or weights):
            return None
        return cls(split, getattr(data_args, "split_part", 0) if split else 0, weights, seed)

    def key(self) -> dict:
        """What the cache key holds: everything that decides which rows are used."""
        return {"data_split": self.split, "part": self.part, "data_weights": self.weights, "seed": self.seed}

    def part_of(self, path: str, rows: list[T]) -> list[T]:
        """This stage's part of one file's rows (all of them when there is no split)."""
        if not self.split:
            return rows
        shares = numbers(self.split)
        if shares is None or len(shares) != len(SPLIT_STAGES) or not 1 <= self.part <= len(SPLIT_STAGES):
            raise DataError(f"--data_split {','.join(self.split)}: give three numbers, the shares of SFT, "
                            "reward/DPO and PPO (e.g. 2,4,4)")
        kept = [rows[i] for i in split_part(len(rows), shares, self.part, self.seed)]
        self.note(f"{path}: data split {','.join(self.split)}: stage {SPLIT_STAGES[self.part - 1]} uses part "
                  f"{self.part}: {len(kept)} of {len(rows)} rows (seed {self.seed})")
        if not kept:
            raise DataError(f"{path}: --data_split {','.join(self.split)} leaves part {self.part} (stage "
                            f"{SPLIT_STAGES[self.part - 1]}) none of its {len(rows)} rows: give the part a larger "
                            "share, or the file more rows")
        return kept

    def mix(self, paths: Sequence[str], per_file: Sequence[list[T]], max_samples: int | None) -> list[T]:
        """The rows of every file, drawn by weight (or all of them, in order, capped at max_samples)."""
        if not self.weights:
            items = [item for items in per_file for item in items]
            return items[:max_samples] if max_samples is not None else items
        weights = numbers(self.weights)
        if weights is None or len(weights) != len(paths):
            raise DataError(f"--data_weights {','.join(self.weights)}: give one number per --data_path file "
                            f"({len(paths)})")
        total = max_samples if max_samples is not None else sum(len(items) for items in per_file)
        counts = mixed_counts([len(items) for items in per_file], weights, total)
        rng = np.random.default_rng(self.seed)
        mixed: list[T] = []
        for path, items, weight, count in zip(paths, per_file, self.weights, counts):
            if count and not items:
                raise DataError(f"{path}: --data_weights {weight} asks for {count} rows, and the file has no good "
                                "row to give")
            mixed += [items[i] for i in draw(len(items), count, rng)] if count else []
            repeated = ", some repeated" if count > len(items) else ""
            self.note(f"{path}: {len(items)} rows read, {count} used (--data_weights {weight}{repeated})")
        return mixed

    def note(self, line: str) -> None:
        self.notes.append(line)
