"""Paired comparisons: two models scored on the same items. The change of a mean score is estimated
from the per-item differences, whose spread is what matters (the two scores of one item are not
independent: an easy question is easy for both), so its standard error is std(d) / sqrt(n), with
d_i = tuned_i - base_i. It is usually much smaller than the two unpaired standard errors combined."""

from __future__ import annotations

import math
from typing import Any

from ..utils.stats import paired_change

NUMBER = (int, float, bool)


def item_scores(samples: list[dict]) -> dict[tuple[str, str], dict[int, float]]:
    """{(metric, filter): {doc_id: score}} from lm-eval's per-document samples (numeric scores only)."""
    scores: dict[tuple[str, str], dict[int, float]] = {}
    for sample in samples:
        for metric in sample.get("metrics", []):
            value = sample.get(metric)
            if isinstance(value, NUMBER):
                scores.setdefault((metric, sample.get("filter", "none")), {})[sample["doc_id"]] = float(value)
    return scores


def compare_runs(base: dict[str, Any], tuned: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per task, metric and filter of lm-eval results present in both runs: both aggregate
    scores, the change and, where the metric is a mean over documents, the paired standard error.
    Each run is lm-eval's results dict with its "samples" ({task: [sample, ...]})."""
    rows = []
    for task, tuned_metrics in tuned["results"].items():
        base_metrics = base["results"].get(task)
        if base_metrics is None:
            continue
        base_items = item_scores(base.get("samples", {}).get(task, []))
        tuned_items = item_scores(tuned.get("samples", {}).get(task, []))
        for key, tuned_value in tuned_metrics.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith("_stderr") or not isinstance(tuned_value, NUMBER) \
                    or not isinstance(base_metrics.get(key), NUMBER):
                continue
            row = {"task": task, "metric": metric, "filter": filter_name, "base": float(base_metrics[key]),
                   "tuned": float(tuned_value), "change": float(tuned_value) - float(base_metrics[key]),
                   "change_stderr": None, "n": None,
                   "higher_is_better": tuned.get("higher_is_better", {}).get(task, {}).get(metric)}
            b, t = base_items.get((metric, filter_name), {}), tuned_items.get((metric, filter_name), {})
            shared = sorted(b.keys() & t.keys())
            # Pair only a metric whose reported score is the mean over its documents (accuracy, exact
            # match); a corpus-level one (perplexity, BLEU, F1) has no per-document difference to pair.
            if shared and _is_mean(b, row["base"]) and _is_mean(t, row["tuned"]):
                change = paired_change([b[i] for i in shared], [t[i] for i in shared])
                row |= {"change": change["change"], "change_stderr": change["change_stderr"], "n": len(shared)}
            rows.append(row)
    return rows


def _is_mean(items: dict[int, float], aggregate: float) -> bool:
    return math.isclose(sum(items.values()) / len(items), aggregate, rel_tol=1e-9, abs_tol=1e-12)


def markdown_table(rows: list[dict[str, Any]], labels: tuple[str, str] = ("base", "tuned")) -> str:
    """The comparison as a markdown table (also how it prints): arrows mark the direction that is better."""
    lines = [f"| task | metric | n | {labels[0]} | {labels[1]} | change | ± paired s.e. |",
             "|---|---|--:|--:|--:|--:|--:|"]
    for row in rows:
        arrow = {True: " ↑", False: " ↓"}.get(row["higher_is_better"], "")
        metric = row["metric"] + ("" if row["filter"] == "none" else f" ({row['filter']})") + arrow
        stderr = "—" if row["change_stderr"] is None else f"{row['change_stderr']:.4f}"
        n = "—" if row["n"] is None else str(row["n"])
        lines.append(f"| {row['task']} | {metric} | {n} | {row['base']:.4f} | {row['tuned']:.4f} | "
                     f"{row['change']:+.4f} | {stderr} |")
    return "\n".join(lines)
