"""Continued pre-training (`tunesmith pt`, tunesmith/pretrain/): raw text read from .txt, JSONL and Parquet; every
token trained; long documents cut with a stride; a packed row of several documents trains exactly as each document
alone, and with --cross_document_attention as one causal row; bad rows named by file and line; resume; held-out
perplexity. Tiny random Llama models with the default model's tokenizer."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from tunesmith.constants import IGNORE_INDEX
from tunesmith.errors import ConfigError, DataError

DOCS = [
    "The river Quenn runs through the city of Veloria, whose bridges are made of blue stone.",
    "Marrowind is an island in the northern sea. Its capital is Talsport, a harbour town famous for amber.",
    "A short one.",
    "Bakers in Veloria sell a bread called dusk loaf, baked with honey and black salt, every evening at six.",
]


def write_txt(path, docs, separator="\n\n"):
    path.write_text(separator.join(docs) + "\n", encoding="utf-8")
    return str(path)


def run_pt(model_dir, data, out, *extra):
    from tunesmith.pretrain.command import run

    return run(["--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out), "--bf16", "false",
                "--report_to", "none", "--save_strategy", "no", "--plot_loss", "false", "--lora_dropout", "0",
                "--disable_dropout", "--logging_steps", "1", "--seed", "0", "--overwrite_cache", *extra])


def pt_args(*flags):
    from tunesmith.hparams import parse_run

    return parse_run("pt", list(flags)).data


def test_txt_documents_by_blank_line_by_separator_line_and_whole_file(tmp_path):
    from tunesmith.data.text_documents import read_text_rows

    path = write_txt(tmp_path / "c.txt", ["one\nstill one", "two", "", "three"])
    rows = list(read_text_rows(path, separator="blank_line"))
    assert [(r.line, r.data["text"]) for r in rows] == [(1, "one\nstill one"), (4, "two"), (8, "three")]
    assert [r.data["text"] for r in read_text_rows(path)] == ["one\nstill one\n\ntwo\n\n\n\nthree"]
    sep = tmp_path / "s.txt"
    sep.write_text("alpha\n<|endoftext|>\nbeta\n\ngamma\n<|endoftext|>\n", encoding="utf-8")
    rows = list(read_text_rows(str(sep), separator="<|endoftext|>", column="body"))
    assert [(r.line, r.data) for r in rows] == [(1, {"body": "alpha"}), (3, {"body": "beta\n\ngamma"})]


def test_jsonl_and_parquet_text_rows_give_the_same_pieces(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tunesmith.data.dataset import build_dataset
    from tunesmith.pretrain.documents import text_kind

    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(DOCS)), encoding="utf-8")
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": DOCS}), parquet)
    txt = write_txt(tmp_path / "c.txt", DOCS)
    args = pt_args("--data_path", str(jsonl), "--text_column", "body", "--max_seq_length", "16", "--overwrite_cache")
    kind = text_kind(args)
    from_jsonl = build_dataset(kind, tokenizer, [str(jsonl)], args)
    from_parquet = build_dataset(kind, tokenizer, [str(parquet)], args)
    from_txt = build_dataset(text_kind(pt_args("--data_path", txt, "--document_separator", "blank_line",
                                               "--text_column", "body", "--max_seq_length", "16")),
                             tokenizer, [txt], args)
    assert from_jsonl["input_ids"] == from_parquet["input_ids"] == from_txt["input_ids"]
    assert from_jsonl["line"][:2] == [1, 1] and from_txt["line"][-1] == 7  # each piece keeps its document's line
    # every document as the tokenizer writes it, plus EOS, cut into pieces of 16: no chat template, nothing lost
    expected = [tokenizer(d)["input_ids"] + [tokenizer.eos_token_id] for d in DOCS]
    assert [t for ids in from_jsonl["input_ids"] for t in ids] == [t for ids in expected for t in ids]
    assert max(map(len, from_jsonl["input_ids"])) == 16
    assert from_jsonl["labels"] == from_jsonl["input_ids"]  # every token trains


def test_long_document_cut_with_stride_trains_each_token_once():
    from tunesmith.data.text_documents import cut_into_pieces

    ids = list(range(100, 125))
    plain = cut_into_pieces(ids, 10)
    assert [p["input_ids"] for p in plain] == [ids[:10], ids[10:20], ids[20:]]
    assert all(p["labels"] == p["input_ids"] for p in plain)
    strided = cut_into_pieces(ids, 10, stride=4)
    assert [p["input_ids"] for p in strided] == [ids[:10], ids[6:16], ids[12:22], ids[18:25]]
    assert strided[1]["labels"] == [IGNORE_INDEX] * 4 + ids[10:16]
    trained = [t for p in strided for t in p["labels"] if t != IGNORE_INDEX]
    assert trained == ids  # each token a label once, in order
    assert cut_into_pieces(ids[:11], 10) == [{"input_ids": ids[:10], "labels": ids[:10]}]  # a 1-token tail trains nothing


def loss_alone(model, pieces) -> tuple[float, int]:
    """Sum of token losses and their count, each piece alone through eager attention."""
    total, count = 0.0, 0
    for ids in pieces:
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum").item()
        count += len(ids) - 1
    return total, count


def test_packed_documents_train_as_each_alone_and_cross_document_as_one_row(tmp_path, tokenizer, chatty_model_dir,
                                                                             monkeypatch):
    from transformers import AutoModelForCausalLM

    from tunesmith.pretrain.collator import OneSequenceCollator

    txt = write_txt(tmp_path / "c.txt", DOCS)
    common = ("--document_separator", "blank_line", "--max_steps", "1", "--per_device_train_batch_size", "4",
              "--learning_rate", "1e-9", "--lr_scheduler_type", "constant")
    packed = run_pt(chatty_model_dir, txt, tmp_path / "packed", *common)
    assert packed.model.get_base_model().config._attn_implementation.endswith("_varlen")
    pieces = [r["input_ids"] for r in packed.train_dataset]
    assert len(pieces) == 4
    first_loss = lambda t: next(r["loss"] for r in t.state.log_history if "loss" in r)  # noqa: E731
    eager = AutoModelForCausalLM.from_pretrained(chatty_model_dir, attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    with torch.no_grad():
        total, count = loss_alone(eager, pieces)
    assert first_loss(packed) == pytest.approx(total / count, rel=1e-5)
    # the packed row trains every token but each piece's first, which nothing in its piece predicts
    row = packed.data_collator(list(packed.train_dataset))
    starts = row["cu_seq_lens_q"][:-1].long()
    ignored = (row["labels"][0] == IGNORE_INDEX).nonzero()[:, 0]
    trained = row["labels"][0] != IGNORE_INDEX
    assert torch.equal(ignored, starts) and torch.equal(row["labels"][0][trained], row["input_ids"][0][trained])

    batches = []  # the order the sampler gave the pieces in, which decides what each attends to
    original = OneSequenceCollator.__call__
    monkeypatch.setattr(OneSequenceCollator, "__call__",
                        lambda self, features: batches.append([f["input_ids"] for f in features])
                        or original(self, features))
    crossed = run_pt(chatty_model_dir, txt, tmp_path / "crossed", *common, "--cross_document_attention", "true")
    with torch.no_grad():
        one_row, one_count = loss_alone(eager, [sum(batches[0], [])])
    assert sorted(batches[0]) == sorted(pieces) and one_count == count + len(pieces) - 1
    assert first_loss(crossed) == pytest.approx(one_row / one_count, rel=1e-5)
    assert abs(one_row / one_count - total / count) > 1e-3  # the two differ, so each test tells them apart
    padded = run_pt(chatty_model_dir, txt, tmp_path / "padded", *common, "--packing", "false")
    assert first_loss(padded) == pytest.approx(total / count, rel=1e-5)


def test_bad_rows_name_file_line_and_field_and_can_be_skipped(tmp_path, tiny_model_dir):
    data = tmp_path / "c.jsonl"
    data.write_text(json.dumps({"text": DOCS[0]}) + "\n" + json.dumps({"content": "x"}) + "\n"
                    + json.dumps({"text": 3}) + "\nnot json\n", encoding="utf-8")
    with pytest.raises(DataError) as error:
        run_pt(tiny_model_dir, str(data), tmp_path / "out", "--max_steps", "1")
    message = str(error.value)
    assert f"{data}:line 2: no `text` field (keys: ['content']): name the field" in message
    assert f"{data}:line 3: field `text`: expected the document as a string, got int" in message
    assert f"{data}:line 4: not valid JSON" in message
    bad_txt = tmp_path / "latin1.txt"
    bad_txt.write_bytes("caf\xe9\nline two\n".encode("latin-1"))
    with pytest.raises(DataError, match=rf"{bad_txt}:line 1: not UTF-8 text: byte 3 is 0xe9"):
        run_pt(tiny_model_dir, str(bad_txt), tmp_path / "out2", "--max_steps", "1")
    trainer = run_pt(tiny_model_dir, str(data), tmp_path / "skipped", "--max_steps", "1", "--skip_bad_rows")
    assert len(trainer.train_dataset) == 1
    assert (tmp_path / "skipped" / "train_bad_rows.txt").read_text().count("\n") == 3


@pytest.mark.parametrize("flags, message", [
    (("--stride", "64", "--max_seq_length", "64"), "--stride 64: give a number of tokens from 0 to --max_seq_length"),
    (("--cross_document_attention", "true", "--packing", "false"), "--cross_document_attention joins a packed batch"),
    (("--data_split", "2,4,4"), "--data_split shares one dataset among SFT"),
    (("--lora_modules_to_save", "embed_tokens", "--finetuning_type", "full"),
     "--lora_modules_to_save trains modules whole beside a LoRA adapter, and --finetuning_type full"),
    (("--lora_trainable_tokens", "é", "--finetuning_type", "full"),
     "--lora_trainable_tokens trains rows of the embeddings beside a LoRA adapter, and --finetuning_type full"),
    (("--lora_trainable_tokens", "é", "--finetuning_type", "prompt_tuning", "--packing", "false"),
     "--lora_trainable_tokens trains rows of the embeddings beside a LoRA adapter, and --finetuning_type "
     "prompt_tuning trains none"),
    (("--lora_trainable_tokens", "é", "--lora_modules_to_save", "lm_head"),
     "--lora_trainable_tokens trains some rows of the embeddings and the head, and --lora_modules_to_save lm_head "
     "trains the whole matrix: keep one."),
])
def test_settings_that_cannot_work_are_refused_in_one_line(tmp_path, flags, message):
    txt = write_txt(tmp_path / "c.txt", DOCS)
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        pt_args("--data_path", txt, "--output_dir", str(tmp_path / "o"), *flags)


def test_resume_and_held_out_perplexity(tmp_path, tiny_model_dir, caplog):
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"text": f"{d} ({i})"}) + "\n" for i, d in enumerate(DOCS * 3)),
                    encoding="utf-8")
    common = ("--max_steps", "4", "--lr_scheduler_type", "constant", "--save_strategy", "steps", "--save_steps", "2",
              "--per_device_train_batch_size", "2", "--val_size", "0.2", "--max_seq_length", "16",
              "--learning_rate", "1e-3")
    straight = run_pt(tiny_model_dir, str(data), tmp_path / "straight", *common)
    run_pt(tiny_model_dir, str(data), tmp_path / "resumed", *common, "--max_steps", "2")
    caplog.set_level(logging.INFO, logger="tunesmith")
    resumed = run_pt(tiny_model_dir, str(data), tmp_path / "resumed", *common)
    assert f"resuming from {tmp_path / 'resumed' / 'checkpoint-2'} (step 2)" in caplog.messages
    losses = lambda t: [r["loss"] for r in t.state.log_history if "loss" in r]  # noqa: E731
    assert losses(resumed) == pytest.approx(losses(straight), rel=1e-4)
    results = json.loads((tmp_path / "straight" / "eval_results.json").read_text())
    assert results["eval_perplexity"] == pytest.approx(pytest.approx(2.718281828 ** results["eval_loss"], rel=1e-4))
    held = {(r["source"], r["line"]) for r in straight.eval_dataset}
    assert held and not held & {(r["source"], r["line"]) for r in straight.train_dataset}


def test_lora_modules_to_save_trains_the_embeddings_whole_and_keeps_a_tied_head_tied(tmp_path, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    txt = write_txt(tmp_path / "c.txt", DOCS)
    trainer = run_pt(tiny_model_dir, txt, tmp_path / "out", "--max_steps", "2", "--learning_rate", "1e-2",
                     "--lora_modules_to_save", "embed_tokens,lm_head")
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any("embed_tokens.modules_to_save" in n for n in trainable)
    base = trainer.model.get_base_model()
    embedding = base.get_input_embeddings().modules_to_save["default"].weight
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir).get_input_embeddings().weight
    assert not torch.equal(embedding, original)  # trained
    # the tiny model ties its head to its embeddings, as SmolLM2 does: the head is the trained matrix too
    assert torch.equal(base.get_output_embeddings().modules_to_save["default"].weight, embedding)
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(tmp_path / "out"))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(reloaded.eval()(input_ids=ids).logits, trainer.model.eval()(input_ids=ids).logits,
                              atol=1e-5)


def test_lora_trainable_tokens_train_only_their_rows_and_the_adapter_reloads_and_merges(tmp_path, tiny_model_dir):
    """PEFT's trainable tokens: the named rows of the embeddings train (the tiny model's head is its embedding
    matrix, as SmolLM2's: the same rows of the head), every other row stays bit-identical, and the adapter holds the
    rows alone; plain PEFT reloads it with the trained logits, and the merged model gives them too."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    txt = write_txt(tmp_path / "c.txt", [*DOCS, "Le café de Veloria est près de la rivière."])
    # the text é is the token `Ã©` (2756; the vocabulary's entry `é` is the byte 0xe9), `Ġriver` an entry as the
    # tokenizer spells it (4626), 42 an id; 4626 again counts once
    trainer = run_pt(tiny_model_dir, txt, tmp_path / "out", "--max_steps", "2", "--learning_rate", "1e-2",
                     "--lora_trainable_tokens", "é,Ġriver,42,4626")
    rows = [2756, 4626, 42]
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert [n for n in trainable if "lora_" not in n] == [
        "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta.default"]

    saved = load_file(str(tmp_path / "out" / "adapter_model.safetensors"))
    tokens = {k: v.shape for k, v in saved.items() if "lora_" not in k}
    assert tokens == {"base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta": (3, 64)}

    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir).get_input_embeddings().weight.detach()
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(tmp_path / "out"))
    ids = torch.tensor([[1, 2756, 4626, 42, 5, 9]])
    with torch.no_grad():
        trained = trainer.model.eval()(input_ids=ids).logits
        assert torch.allclose(reloaded.eval()(input_ids=ids).logits, trained, atol=1e-5)
        merged = reloaded.merge_and_unload()
        assert torch.allclose(merged(input_ids=ids).logits, trained, atol=1e-5)
    embeddings = merged.get_input_embeddings().weight.detach()
    others = torch.ones(len(original), dtype=torch.bool)
    others[rows] = False
    assert torch.equal(embeddings[others], original[others])
    assert all(not torch.equal(embeddings[r], original[r]) for r in rows)
    assert torch.equal(merged.get_output_embeddings().weight, embeddings)  # the tied head: the same rows trained


def test_lora_trainable_tokens_outside_the_vocabulary_are_refused(tmp_path, tiny_model_dir):
    txt = write_txt(tmp_path / "c.txt", DOCS)
    with pytest.raises(ConfigError, match=r"--lora_trainable_tokens 'Quenn' is not a token of the vocabulary \(it "
                                          r"encodes as 2 tokens: \['Qu', 'enn'\]\): name those pieces or their ids"):
        run_pt(tiny_model_dir, txt, tmp_path / "a", "--max_steps", "1", "--lora_trainable_tokens", "Quenn")
    with pytest.raises(ConfigError, match=r"--lora_trainable_tokens 99999: the model's embeddings have 49152 rows"):
        run_pt(tiny_model_dir, txt, tmp_path / "b", "--max_steps", "1", "--lora_trainable_tokens", "99999")


def test_lora_trainable_tokens_refuse_the_sharding_peft_cannot_do(tiny_model_dir, monkeypatch):
    """Found on two CPU ranks: under FSDP2 a tied head's trained rows are one parameter of two modules that
    accelerate puts in one unit, which fully_shard fails on; under ZeRO-3 PEFT gathers the rows on a CUDA device.
    (An untied head trains under FSDP2, and ZeRO-2 either way.)"""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from tunesmith.models.trainable_tokens import trainable_token_indices

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    fsdp = SimpleNamespace(fsdp="full_shard", deepspeed=None)
    with pytest.raises(ConfigError, match=r"--lora_trainable_tokens under FSDP on a model whose head is its "
                                          r"embedding matrix: .* use --deepspeed configs/ds_zero2.json"):
        trainable_token_indices(["42"], model, fsdp, tokenizer_for=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    zero3 = SimpleNamespace(fsdp="", deepspeed={"zero_optimization": {"stage": 3}})
    with pytest.raises(ConfigError, match=r"--lora_trainable_tokens under ZeRO-3 without a CUDA device"):
        trainable_token_indices(["42"], model, zero3, tokenizer_for=None)
    zero2 = SimpleNamespace(fsdp="", deepspeed={"zero_optimization": {"stage": 2}})
    assert trainable_token_indices(["42"], model, zero2, tokenizer_for=None) == {"model.embed_tokens": [42],
                                                                                 "lm_head": [42]}


def test_lora_trainable_tokens_do_not_change_an_adapter_that_goes_on(tmp_path, tiny_model_dir):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                             "base_model_name_or_path": tiny_model_dir}))
    with pytest.raises(ConfigError, match=rf"--lora_trainable_tokens sets up a new adapter, and this run continues "
                                          rf"{adapter}, whose adapter_config.json decides what trains"):
        pt_args("--data_path", write_txt(tmp_path / "c.txt", DOCS), "--output_dir", str(tmp_path / "o"),
                "--adapter_name_or_path", str(adapter), "--lora_trainable_tokens", "é")


def test_inspect_shows_the_pieces_of_a_text_corpus(tmp_path, tiny_model_dir, tokenizer, capsys):
    from tunesmith.inspect.command import run

    txt = write_txt(tmp_path / "c.txt", DOCS)
    records = run(["--model_name_or_path", tiny_model_dir, "--data_path", txt, "--document_separator", "blank_line",
                   "--max_seq_length", "16", "--color", "never", "--show", "-1"])
    assert [(r["line"], r.get("example")) for r in records][:3] == [(1, [1, 2]), (1, [2, 2]), (3, [1, 2])]
    assert all(r["labels"] == r["input_ids"] for r in records)
    ids = [t for r in records for t in r["input_ids"]]
    assert ids == [t for d in DOCS for t in tokenizer(d)["input_ids"] + [tokenizer.eos_token_id]]
    out = capsys.readouterr().out
    assert f"=== {txt}:1 example 1/2  16/16 tokens trained" in out and "4 rows, 0 bad" in out
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text(json.dumps({"text": DOCS[0]}) + "\n", encoding="utf-8")
    records = run(["--model_name_or_path", tiny_model_dir, "--data_path", str(jsonl), "--color", "never"])
    assert len(records) == 1 and records[0]["labels"] == records[0]["input_ids"]


def test_sft_points_text_rows_to_pt(tmp_path):
    from tunesmith.data.formats import Row, detect_format

    with pytest.raises(DataError, match=r"unknown format \(keys: \['text'\]\).*train on them with `tunesmith pt`"):
        detect_format(Row("c.jsonl", 1, {"text": "x"}))


def test_full_and_qlora_train_on_text(tmp_path, tiny_model_dir):
    import math

    import bitsandbytes as bnb
    from safetensors.torch import load_file

    txt = write_txt(tmp_path / "c.txt", DOCS)
    base = load_file(f"{tiny_model_dir}/model.safetensors")
    full = run_pt(tiny_model_dir, txt, tmp_path / "full", "--max_steps", "1", "--finetuning_type", "full",
                  "--document_separator", "blank_line")
    state = full.model.state_dict()
    assert all(not torch.equal(state[k], base[k]) for k in base)
    qlora = run_pt(tiny_model_dir, txt, tmp_path / "qlora", "--max_steps", "2", "--quantization_bit", "4",
                   "--learning_rate", "1e-2")
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in qlora.model.modules())
    assert all(math.isfinite(r["loss"]) for r in qlora.state.log_history if "loss" in r)
    assert all(v.abs().sum() > 0 for k, v in qlora.model.state_dict().items() if "lora_B" in k)


@pytest.mark.distributed
@pytest.mark.heavy  # about 180 s on 2 shared cores: the opt-in tier, as SFT's ZeRO-2 torchrun run
def test_two_rank_zero3_pt_saves_a_complete_adapter(tmp_path, tiny_model_dir):
    """`tunesmith pt` under torchrun with DeepSpeed ZeRO-3 on two CPU ranks (gloo), as SFT's distributed tests run."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    from tunesmith.train.checkpoints import empty_tensors

    root = Path(__file__).resolve().parents[3]
    txt = write_txt(tmp_path / "c.txt", DOCS * 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
         str(root / "pt" / "train.py"), "--model_name_or_path", tiny_model_dir, "--data_path", txt,
         "--document_separator", "blank_line", "--output_dir", str(out), "--max_steps", "2",
         "--per_device_train_batch_size", "2", "--save_strategy", "no", "--plot_loss", "false",
         "--deepspeed", str(root / "configs" / "ds_zero3.json")],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())


def test_text_files_mix_by_data_weights(tmp_path, tokenizer):
    from tunesmith.data.dataset import build_dataset
    from tunesmith.data.mix import RowSelection
    from tunesmith.pretrain.documents import text_kind

    a = write_txt(tmp_path / "a.txt", [f"Alpha document {i}." for i in range(4)])
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps({"text": f"Beta document {i}."}) + "\n" for i in range(4)), encoding="utf-8")
    args = pt_args("--data_path", f"{a},{b}", "--data_weights", "1,3", "--max_samples", "8",
                   "--document_separator", "blank_line", "--overwrite_cache")
    data = build_dataset(text_kind(args), tokenizer, args.data_path, args, max_samples=8,
                         selection=RowSelection.of(args, 0))
    sources = [s.rsplit("/", 1)[1] for s in data["source"]]
    assert sources.count("a.txt") == 2 and sources.count("b.jsonl") == 6
