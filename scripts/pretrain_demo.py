"""The continued pre-training demo: LoRA-train the embedded model on data/demo/pretrain/marrowind.txt (an invented
island's encyclopedia, scripts/make_pretrain_corpus.py), then measure the base and the trained model, paired, on the
held-out documents (the same facts in wordings never trained) and on a few questions to continue. The base is the
trained model with its adapter switched off: the same weights the run started from.

    python scripts/pretrain_demo.py [--flag value ...]   # flags go to `tunesmith pt configs/pt_lora_demo.yaml`

Prints, and writes to OUTPUT_DIR/demo_results.json: the held-out perplexity before and after, the mean per-document
change of log-perplexity with its paired standard error, and each question's greedy continuation before and after.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path

import torch

from tunesmith.data.text_documents import document_ids, read_text_rows
from tunesmith.generation import BASE, Engine, SamplingParams
from tunesmith.pretrain.command import run

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "data" / "demo" / "pretrain" / "marrowind_heldout.txt"
QUESTIONS = ROOT / "data" / "demo" / "pretrain" / "questions.jsonl"


def mean_nll(model, ids: list[int]) -> float:
    """The mean negative log-likelihood per predicted token of one document."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.float().item()


def greedy(engine: Engine, tokenizer, prompts: list[str], adapter: str | None, tokens: int = 8) -> list[str]:
    """Each prompt's greedy continuation (raw text, no chat template), through the generation engine; adapter=BASE:
    the trained model with its adapter off."""
    ids = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    return [c[0].text for c in engine.generate(ids, params, adapter=adapter)]


def measure(model, tokenizer, documents: list[list[int]], questions: list[dict], base: bool) -> dict:
    """base: the trained model with its adapter off, the weights the run started from."""
    with model.disable_adapter() if base else contextlib.nullcontext():
        nll = [mean_nll(model, ids) for ids in documents]
    answers = greedy(Engine(model, tokenizer), tokenizer, [q["prompt"] for q in questions], BASE if base else None)
    return {"nll": nll, "tokens": [len(ids) - 1 for ids in documents], "answers": answers}


def main(argv: list[str]) -> dict:
    trainer = run([str(ROOT / "configs" / "pt_lora_demo.yaml"), *argv])
    model, tokenizer = trainer.model.eval(), trainer.processing_class
    documents = [document_ids(tokenizer, row.data["text"]) for row in read_text_rows(str(HELDOUT),
                                                                                       separator="blank_line")]
    questions = [json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines()]
    before = measure(model, tokenizer, documents, questions, base=True)
    after = measure(model, tokenizer, documents, questions, base=False)

    def perplexity(m: dict) -> float:  # over every held-out token
        return math.exp(sum(n * t for n, t in zip(m["nll"], m["tokens"])) / sum(m["tokens"]))

    diffs = [a - b for a, b in zip(after["nll"], before["nll"])]  # per document: change of log-perplexity
    mean = sum(diffs) / len(diffs)
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    results = {
        "documents": len(documents), "tokens": sum(before["tokens"]),
        "perplexity_before": perplexity(before), "perplexity_after": perplexity(after),
        "mean_log_perplexity_change": mean, "paired_standard_error": se,
        "documents_improved": sum(d < 0 for d in diffs),
        "questions": [{**q, "before": b, "after": a, "correct_before": q["answer"] in b, "correct_after": q["answer"] in a}
                      for q, b, a in zip(questions, before["answers"], after["answers"])],
        "train_runtime_s": trainer.state.log_history[-1].get("train_runtime"),
    }
    print(f"held-out perplexity ({results['documents']} documents, {results['tokens']} tokens): "
          f"base {results['perplexity_before']:.2f} -> trained {results['perplexity_after']:.2f}")
    print(f"per-document log-perplexity change {mean:+.3f} (paired standard error {se:.3f}); "
          f"{results['documents_improved']}/{len(documents)} documents improved")
    for q in results["questions"]:
        print(f"{q['prompt']!r}: base {q['before']!r} -> trained {q['after']!r}")
    right = [sum(q[f"correct_{w}"] for q in results["questions"]) for w in ("before", "after")]
    print(f"answers holding the fact: base {right[0]}/{len(questions)} -> trained {right[1]}/{len(questions)}")
    Path(trainer.args.output_dir, "demo_results.json").write_text(json.dumps(results, indent=2) + "\n",
                                                                  encoding="utf-8")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
