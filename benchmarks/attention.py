"""Packed attention alone: what one layer's attention over a packed row costs, forward and backward, on the kernels
tunesmith runs (models/attention.py) against the kernel it replaced and what a user would otherwise run.

    .venv/bin/python -m benchmarks.attention [--shapes smollm2] [--dtypes auto] [--row_tokens 2048]
                                             [--kernels old,new,...] [--rounds 5] [--repeats 3]

The row: the SFT benchmark's conversations (its default set, 43 to 507 tokens, tokenized for SmolLM2) in its order,
as many as fit in --row_tokens: at 2,048, its first 8 (1,986 tokens; 3 of them longer than the window), a packed
batch of 8. Query, key and value are random, [1, heads, tokens, head_dim] with grouped key/value heads (--shapes:
SmolLM2-135M's 9/3/64, a Mistral-7B-like 32/8/128), and every call runs the forward and the backward of the inputs'
gradients (the sinks' too, for gpt-oss) from a fixed output gradient. The kernels, by what the model's attention
adds to causal attention:

  causal (Llama)
    old               SDPA once per example, causal (the CPU path of 6746938, before windows, soft-caps and sinks)
    new               sdpa_varlen: the same loop after the argument check, the mask check already done for the layer
    new_first_call    new on a layer's first packed row: the check of the model's mask included (once a layer a run)
    row_sdpa          stock sdpa over the whole row with the block-diagonal causal mask (packing without tunesmith)
    row_eager         stock eager (Llama's) over the whole row with that mask
    padded_sdpa       --packing false: the same examples as a right-padded batch through stock sdpa
  sliding window (Mistral, Gemma 3, gpt-oss's sliding layers), --window tokens
    old               as above: it dropped the window, so it computed other attention than the model's
    new_window        sdpa_varlen: SDPA per example, an explicit causal-window mask where the example is longer
    row_sdpa_window   stock sdpa over the row with the block-diagonal causal-window mask
    row_eager_window  stock eager over the row with that mask
    padded_sdpa_window  the padded batch through stock sdpa with the window
  logit soft-cap --softcap (Gemma 2; eager only)
    new_softcap       eager_varlen: Gemma 2's own eager_attention_forward once per example
    row_eager_softcap Gemma 2's eager over the row with the block-diagonal mask
    padded_eager_softcap  the padded batch through Gemma 2's eager
  attention sinks (gpt-oss's full layers; eager only)
    new_sinks         eager_varlen: gpt-oss's own eager_attention_forward once per example
    row_eager_sinks   gpt-oss's eager over the row with the block-diagonal mask
    padded_eager_sinks  the padded batch through gpt-oss's eager

`max diff` is the largest difference of a kernel's forward output from the model's eager attention over the row with
the block-diagonal (causal-window) mask: every kernel but `old` on a windowed layer must compute that. --kernels times
a subset (the whole-row eager kernels take most of a run at the Mistral shape); the references are still computed.

How the numbers are taken: every shape and dtype (`--dtypes auto`: float32, and bfloat16 where the CPU computes it
natively, as SFT's --bf16 auto decides) runs in its own subprocess, --repeats times, the groups taking turns, each
once the cores are idle (benchmarks/common.py, which records the share of the cores other processes took meanwhile).
A run during which other processes took over --quiet_share of the cores is left out of the table and run again, up
to --max_runs runs a group (with none quiet, the table takes every run and says so). Inside a run, every kernel is
called once to warm up, then --rounds times, the kernels taking turns in each round; a run's figure for a kernel is
the median of its rounds. The table gives the median over runs of those, with their spread (min-max), in ms a call
and row tokens a second.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import (
    add_quiet_arguments,
    add_worker_arguments,
    check_choices,
    loaded,
    medians,
    run_interleaved,
    run_worker,
    spread,
)

SHAPES = {"smollm2": (9, 3, 64), "mistral": (32, 8, 128)}  # query heads, key/value heads, head_dim
MODELING = {"llama": "transformers.models.llama.modeling_llama", "gemma2": "transformers.models.gemma2.modeling_gemma2",
            "gpt_oss": "transformers.models.gpt_oss.modeling_gpt_oss"}
# (feature, reference kernel for `max diff`, kernels); "old" under the window is old's time, compared to the window.
FEATURES = (
    ("causal (Llama)", "row_eager", ("old", "new", "new_first_call", "row_sdpa", "row_eager", "padded_sdpa")),
    ("sliding window {window} (Mistral, Gemma 3)", "row_eager_window",
     ("old", "new_window", "row_sdpa_window", "row_eager_window", "padded_sdpa_window")),
    ("soft-cap {softcap} (Gemma 2)", "row_eager_softcap", ("new_softcap", "row_eager_softcap", "padded_eager_softcap")),
    ("sinks (gpt-oss)", "row_eager_sinks", ("new_sinks", "row_eager_sinks", "padded_eager_sinks")),
)
KERNELS = tuple(dict.fromkeys(name for _, _, names in FEATURES for name in names))
NOTES = {("sliding", "old"): "drops the window: not the model's attention",
         ("causal", "new_first_call"): "once per layer in a run"}
# The token counts of the first 40 conversations of benchmarks/sft.py's default set (300 conversations, max_seq_length 512,
# SmolLM2-135M-Instruct's tokenizer and tunesmith's template), in its order.
BENCH_SFT_LENGTHS = (124, 466, 55, 504, 111, 414, 76, 236, 445, 91, 253, 507, 72, 77, 154, 475, 248, 449, 58, 52, 118,
                     109, 287, 229, 440, 46, 484, 363, 174, 190, 392, 52, 381, 483, 348, 125, 358, 377, 314, 481)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="smollm2", help=f"Comma-separated subset of {', '.join(SHAPES)}.")
    p.add_argument("--dtypes", default="auto",
                   help="float32, bfloat16, or both (comma-separated); auto: float32, and bfloat16 where native.")
    p.add_argument("--row_tokens", type=int, default=2048, help="Tokens of the packed row.")
    p.add_argument("--window", type=int, default=256, help="Sliding window of the windowed layer, in tokens.")
    p.add_argument("--softcap", type=float, default=50.0, help="Gemma 2's attention logit soft-cap.")
    p.add_argument("--kernels", default=",".join(KERNELS), help="Comma-separated subset of the kernels to time.")
    p.add_argument("--rounds", type=int, default=5, help="Timed calls of every kernel per run, after one warm-up.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the random inputs.")
    add_quiet_arguments(p)
    p.add_argument("--max_runs", type=int, default=6,
                   help="Runs of a group at most, while fewer than --repeats of them ran on quiet cores.")
    add_worker_arguments(p)
    args = p.parse_args(argv)
    check_choices(p, "shapes", args.shapes, SHAPES)
    check_choices(p, "kernels", args.kernels, KERNELS)
    unknown = [d for d in args.dtypes.split(",") if d not in ("auto", "float32", "bfloat16")]
    if unknown:
        p.error(f"--dtypes {args.dtypes}: unknown {unknown}; choose float32, bfloat16 or auto")
    return args


def dtypes(choice: str) -> list[str]:
    if choice != "auto":
        return choice.split(",")
    from tunesmith.utils.hardware import native_bf16

    return ["float32", "bfloat16"] if native_bf16(on_cpu=True) else ["float32"]


def example_lengths(row_tokens: int) -> list[int]:
    """The SFT benchmark's conversations in order, while they fit in the row (one at least)."""
    lengths: list[int] = []
    for n in BENCH_SFT_LENGTHS:
        if lengths and sum(lengths) + n > row_tokens:
            break
        lengths.append(n)
    return lengths


# ---------------------------------------------------------------- inputs and kernels


def attention_module(family: str, heads: int, kv_heads: int, head_dim: int, dtype: Any) -> Any:
    """What the attention functions read from a model's attention layer, in a class that lives (by its __module__)
    in the family's modeling file, where eager_varlen looks the eager function up."""
    import torch
    from torch import nn

    module_name = MODELING[family]
    importlib.import_module(module_name)
    module = type("Attention", (nn.Module,), {"__module__": module_name})()
    module.num_key_value_groups, module.head_dim, module.is_causal = heads // kv_heads, head_dim, True
    if family == "gpt_oss":  # one learned sink logit per head, trained
        module.sinks = nn.Parameter(torch.randn(heads, dtype=dtype))
    return module.train()


def masks(lengths: list[int], window: int | None, dtype: Any) -> dict[str, Any]:
    """The row's block-diagonal causal(-window) mask as sdpa (bool) and eager (additive) take it, [1, 1, T, T], and
    the padded batch's, [B, 1, L, L] (causal, keys inside the example)."""
    import torch

    example = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    position = torch.cat([torch.arange(n) for n in lengths])
    distance = position[:, None] - position[None, :]
    row = (example[:, None] == example[None, :]) & (distance >= 0)
    longest = max(lengths)
    steps = torch.arange(longest)
    inside = steps[None, None, :] < torch.tensor(lengths)[:, None, None]  # [B, 1, L]: keys inside the example
    padded = (steps[:, None] - steps[None, :] >= 0)[None] & inside
    if window is not None:
        row = row & (distance < window)
        padded = padded & (steps[:, None] - steps[None, :] < window)[None]

    def additive(allowed: Any) -> Any:
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)

    row, padded = row[None, None], padded[:, None]
    return {"row_bool": row, "row_float": additive(row), "padded_bool": padded, "padded_float": additive(padded)}


def old_sdpa_per_example(module: Any, query: Any, key: Any, value: Any, cu_seq_lens_q: Any, scaling: float) -> Any:
    """The CPU path of tunesmith's sdpa_varlen before 6321d4e (6746938's models/attention.py): SDPA once per example,
    causal, whatever else the model asked for."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = cu_seq_lens_q.tolist()
    outputs = [sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None, dropout=0.0,
                                      scaling=scaling)[0] for s, e in zip(bounds[:-1], bounds[1:])]
    return torch.cat(outputs, dim=1)


def kernels(args: argparse.Namespace, shape: str, dtype: Any, lengths: list[int]) -> tuple[dict[str, Callable], dict]:
    """{name: call(inputs) -> output [batch, tokens, heads, head_dim]} and the inputs they share."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from tunesmith.models.attention import eager_varlen_attention_forward, sdpa_varlen_attention_forward

    heads, kv_heads, head_dim = SHAPES[shape]
    scaling = head_dim ** -0.5
    modules = {family: attention_module(family, heads, kv_heads, head_dim, dtype) for family in MODELING}
    eager = {family: importlib.import_module(MODELING[family]).eager_attention_forward for family in MODELING}
    plain, windowed = masks(lengths, None, dtype), masks(lengths, args.window, dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    # What a decoder layer passes beside query, key, value and mask in a packed training row (the collator's keys).
    row = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lengths), "max_length_k": max(lengths),
           "position_ids": torch.cat([torch.arange(n) for n in lengths])[None], "dropout": 0.0, "scaling": scaling}
    window, softcap, sinks = args.window, args.softcap, modules["gpt_oss"].sinks

    def new(mask: Any, fresh: bool = False, **kw: Any) -> Callable:
        def call(q: Any, k: Any, v: Any) -> Any:
            module = attention_module("llama", heads, kv_heads, head_dim, dtype) if fresh else modules["llama"]
            return sdpa_varlen_attention_forward(module, q, k, v, mask, **row, **kw)[0]
        return call

    def new_eager(family: str, **kw: Any) -> Callable:
        return lambda q, k, v: eager_varlen_attention_forward(modules[family], q, k, v, plain["row_float"], **row,
                                                              **kw)[0]

    def stock(function: Callable, family: str, mask: Any, **kw: Any) -> Callable:
        return lambda q, k, v: function(modules[family], q, k, v, mask, dropout=0.0, scaling=scaling, **kw)[0]

    calls = {
        "old": lambda q, k, v: old_sdpa_per_example(modules["llama"], q, k, v, cu, scaling),
        "new": new(plain["row_bool"]),
        "new_first_call": new(plain["row_bool"], fresh=True),
        "row_sdpa": stock(sdpa_attention_forward, "llama", plain["row_bool"]),
        "row_eager": stock(eager["llama"], "llama", plain["row_float"]),
        "padded_sdpa": stock(sdpa_attention_forward, "llama", plain["padded_bool"]),
        "new_window": new(windowed["row_bool"], sliding_window=window),
        "row_sdpa_window": stock(sdpa_attention_forward, "llama", windowed["row_bool"]),
        "row_eager_window": stock(eager["llama"], "llama", windowed["row_float"]),
        "padded_sdpa_window": stock(sdpa_attention_forward, "llama", windowed["padded_bool"]),
        "new_softcap": new_eager("gemma2", softcap=softcap),
        "row_eager_softcap": stock(eager["gemma2"], "gemma2", plain["row_float"], softcap=softcap),
        "padded_eager_softcap": stock(eager["gemma2"], "gemma2", plain["padded_float"], softcap=softcap),
        "new_sinks": new_eager("gpt_oss", s_aux=sinks),
        "row_eager_sinks": stock(eager["gpt_oss"], "gpt_oss", plain["row_float"]),
        "padded_eager_sinks": stock(eager["gpt_oss"], "gpt_oss", plain["padded_float"]),
    }
    generator = torch.Generator().manual_seed(args.seed)
    tokens = sum(lengths)
    packed = [torch.randn(1, n, tokens, head_dim, generator=generator).to(dtype) for n in (heads, kv_heads, kv_heads)]
    padded = [torch.zeros(len(lengths), t.shape[1], max(lengths), head_dim, dtype=dtype) for t in packed]
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        for p, t in zip(padded, packed):
            p[i, :, : e - s] = t[0, :, s:e]
    inputs = {"packed": [t.requires_grad_() for t in packed], "padded": [t.requires_grad_() for t in padded],
              "sinks": sinks}
    inputs["grad_packed"] = torch.randn(1, tokens, heads, head_dim, generator=generator).to(dtype)
    inputs["grad_padded"] = torch.randn(len(lengths), max(lengths), heads, head_dim, generator=generator).to(dtype)
    return calls, inputs


def unpad(out: Any, lengths: list[int]) -> Any:
    import torch

    return torch.cat([out[i, :n] for i, n in enumerate(lengths)])[None]


def run_group(args: argparse.Namespace, workdir: Path) -> dict:
    """One shape and dtype: every kernel warmed up and checked, then timed --rounds times, the kernels in turn."""
    import torch

    shape, dtype_name = args.worker.split("-")
    dtype = getattr(torch, dtype_name)
    lengths = example_lengths(args.row_tokens)
    calls, inputs = kernels(args, shape, dtype, lengths)
    result: dict[str, Any] = {"threads": torch.get_num_threads(), "tokens": sum(lengths), "lengths": lengths}

    def run(name: str, grad: bool) -> Any:
        layout = "padded" if name.startswith("padded") else "packed"
        for t in (*inputs[layout], inputs["sinks"]):
            t.grad = None
        with torch.enable_grad() if grad else torch.no_grad():
            out = calls[name](*inputs[layout])
            if grad:
                out.backward(inputs[f"grad_{layout}"])
        return unpad(out, lengths) if layout == "padded" else out

    timed = args.kernels.split(",")
    references = [reference for _, reference, names in FEATURES if set(names) & set(timed)]
    outputs = {name: run(name, grad=False).double() for name in dict.fromkeys(timed + references)}
    for feature, reference, names in FEATURES:
        for name in set(names) & set(timed):
            key = f"diff:{feature.split()[0]}:{name}"
            result[key] = (outputs[name] - outputs[reference]).abs().max().item()
    for name in timed:  # warm-up: allocator, thread pool, first-call paths
        run(name, grad=True)
    times: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(args.rounds):
        for name in timed:
            start = time.perf_counter()
            run(name, grad=True)
            times[name].append(time.perf_counter() - start)
    result.update({f"ms:{name}": 1000 * statistics.median(values) for name, values in times.items()})
    return result


RUNS = {f"{shape}-{dtype}": run_group for shape in SHAPES for dtype in ("float32", "bfloat16")}


# ---------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if run_worker(args, RUNS):
        return
    groups = [f"{shape}-{dtype}" for shape in args.shapes.split(",") for dtype in dtypes(args.dtypes)]
    lengths = example_lengths(args.row_tokens)
    print(f"row: {len(lengths)} examples, {sum(lengths)} tokens: {lengths}; window {args.window}, soft-cap "
          f"{args.softcap}; {args.rounds} timed calls of each kernel a run, {args.repeats} quiet runs of "
          f"{', '.join(groups)} (at most {args.max_runs} each), interleaved", flush=True)
    worker_args = ["--row_tokens", str(args.row_tokens), "--window", str(args.window), "--softcap", str(args.softcap),
                   "--kernels", args.kernels, "--rounds", str(args.rounds), "--seed", str(args.seed)]
    results: dict[str, list[dict]] = {group: [] for group in groups}
    with tempfile.TemporaryDirectory(prefix="bench_attention.") as tmp:
        for _ in range(args.max_runs):  # one round of runs at a time, until each group has its quiet runs
            pending = [g for g in groups if len(quiet(results[g], args.quiet_share)) < args.repeats]
            if not pending:
                break
            done = run_interleaved(__spec__.name, pending, 1, Path(tmp), worker_args, args.quiet_share,
                                   lambda r: ", ".join(f"{k[3:]} {v:.1f}" for k, v in r.items()
                                                       if k in ("ms:old", "ms:new", "ms:new_window")) + " ms a call",
                                   args.settle)
            for group, runs in done.items():
                results[group] += runs
    for group, runs in results.items():
        if runs:
            print_table(args, group, runs)


def quiet(runs: list[dict], share: float) -> list[dict]:
    return [r for r in runs if r["other_cpu"] <= share]


def print_table(args: argparse.Namespace, group: str, every_run: list[dict]) -> None:
    """Medians over the quiet runs (over every run, flagged, when none was quiet)."""
    runs = quiet(every_run, args.quiet_share) or every_run
    r = medians(runs)
    heads, kv_heads, head_dim = SHAPES[group.split("-")[0]]
    other = [x["other_cpu"] for x in runs]
    which = (f"{len(runs)} of {len(every_run)} runs (those with other CPU over {args.quiet_share:.0%} left out)"
             if runs is not every_run or not loaded(runs, args.quiet_share) else f"{len(runs)} runs, none quiet")
    print(f"\n{group}: {heads} query heads, {kv_heads} key/value heads, head_dim {head_dim}; {int(r['tokens'])} "
          f"tokens, {int(r['threads'])} threads; {which}, other CPU {min(other):.0%}-{max(other):.0%}"
          f"{loaded(runs, args.quiet_share)}")
    print(f"{'kernel':<22}{'ms/call':>9}{'spread':>16}{'tokens/s':>10}{'x old':>7}{'max diff':>10}  note")
    for feature, _, names in FEATURES:
        names = [name for name in names if f"ms:{name}" in r]
        if names:
            print(f"-- {feature.format(window=args.window, softcap=f'{args.softcap:g}')}")
        for name in names:
            ms = r[f"ms:{name}"]
            diff = r[f"diff:{feature.split()[0]}:{name}"]
            note = NOTES.get((feature.split()[0], name), "")
            versus = f"{ms / r['ms:old']:.2f}" if "ms:old" in r else "-"
            print(f"{name:<22}{ms:>9.1f}{spread(runs, f'ms:{name}', 1):>16}{r['tokens'] / ms * 1000:>10.0f}"
                  f"{versus:>7}{diff:>10.1e}  {note}".rstrip())


if __name__ == "__main__":
    main()
