"""`tunesmith distill` on tiny random Llamas with the real tokenizer: its losses equal TRL 1.16's (GKD's
generalized_jsd_loss and the DistillationTrainer's chunked divergence) on the same batch, models and settings; a
packed run trains the padded run's objective; the student's trainable weights move and the teacher's do not; a
resumed run continues the same trajectory; the evaluation reports the KL to the teacher; each refusal is one line."""

from __future__ import annotations

import json
import logging
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.tiny_models import build_spm_tokenizer, build_tiny_model_dir
from tunesmith.constants import IGNORE_INDEX
from tunesmith.data.collator import PaddingCollator
from tunesmith.distill import losses
from tunesmith.distill.command import run as distill_main
from tunesmith.distill.trainer import DistillTrainer
from tunesmith.errors import ConfigError, PathError
from tunesmith.hparams import parse_run, rules

CONVERSATIONS = [
    [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
     {"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "You're welcome."}]
    for a in range(4) for b in range(3)
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    return str(path)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, tokenizer) -> str:
    """Another random Llama of the same vocabulary, wider and with larger weights: its distributions differ from
    the student's."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("teacher"), tokenizer, hidden_size=96, seed=1,
                                initializer_range=0.2)


def flags(student: str, teacher: str, data: str, out, *extra: str) -> list[str]:
    return ["--model_name_or_path", student, "--teacher_model_name_or_path", teacher, "--data_path", data,
            "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "3", "--learning_rate",
            "1e-2", "--lora_dropout", "0", "--bf16", "false", "--save_strategy", "no", "--plot_loss", "false",
            "--report_to", "none", "--seed", "0", *extra]


def losses_of(trainer) -> list[float]:
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


# -- the loss against TRL's


@pytest.fixture(scope="module")
def untrained(tiny_model_dir, teacher_dir, data, tmp_path_factory) -> DistillTrainer:
    """A trainer whose run changed nothing (learning rate 0): its student and teacher as loaded."""
    return distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path_factory.mktemp("untrained"),
                              "--max_steps", "1", "--learning_rate", "0"))


def padded_batch(trainer: DistillTrainer) -> dict[str, torch.Tensor]:
    features = [trainer.train_dataset[i] for i in range(4)]
    return PaddingCollator(trainer.processing_class.pad_token_id)(features)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_the_loss_equals_trls_on_the_same_batch(untrained, beta, temperature):
    from trl.experimental.gkd import GKDTrainer
    from trl.trainer.distillation_trainer import _chunked_divergence_loss

    trainer, batch = untrained, padded_batch(untrained)
    trainer.beta, trainer.temperature = beta, temperature
    student, teacher = trainer.model, trainer.teacher
    student.train()
    ours = trainer.compute_loss(student, dict(batch))

    with torch.no_grad():
        forward = {k: batch[k] for k in ("input_ids", "attention_mask")}
        s_out = student(**forward, output_hidden_states=True)
        t_out = teacher(**forward, output_hidden_states=True)
    labels = batch["labels"][:, 1:]
    assert (labels != IGNORE_INDEX).sum() < (batch["attention_mask"][:, 1:] == 1).sum()  # prompts are not trained
    # GKD's loss: logits [B, T-1, V], the replies' labels, reduction per trained token
    gkd = GKDTrainer.generalized_jsd_loss(s_out.logits[:, :-1], t_out.logits[:, :-1], labels=labels, beta=beta,
                                          temperature=temperature)
    # The DistillationTrainer's: last hidden states and each model's own output head, the replies as the mask
    head = student.get_output_embeddings()
    stable, _, _ = _chunked_divergence_loss(
        s_out.hidden_states[-1][:, :-1], t_out.hidden_states[-1][:, :-1], head.weight,
        teacher.get_output_embeddings().weight, (labels != IGNORE_INDEX).long(), beta, temperature=temperature)
    assert ours.item() > 1e-3
    torch.testing.assert_close(ours.detach(), gkd, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.detach(), stable, rtol=0, atol=1e-5)


def test_the_sft_weight_adds_the_reply_tokens_cross_entropy(untrained):
    trainer, batch = untrained, padded_batch(untrained)
    trainer.beta, trainer.temperature = 0.5, 1.0
    trainer.model.train()
    alone = trainer.compute_loss(trainer.model, dict(batch)).detach()
    trainer.sft_weight = 0.5
    try:
        both = trainer.compute_loss(trainer.model, dict(batch)).detach()
    finally:
        trainer.sft_weight = 0.0
    with torch.no_grad():
        sft = trainer.model(**{k: v for k, v in batch.items()}).loss  # the model's own SFT loss, per reply token
    torch.testing.assert_close(both, alone + 0.5 * sft, rtol=1e-5, atol=1e-5)


def test_chunks_give_the_same_divergence_and_gradients(monkeypatch):
    torch.manual_seed(0)
    student = torch.randn(7, 50, requires_grad=True)
    teacher = torch.randn(7, 50)
    results = []
    for chunk in (1 << 24, 100):  # one chunk; chunks of two positions, recomputed in the backward
        monkeypatch.setattr(losses, "CHUNK_ELEMENTS", chunk)
        student.grad = None
        value = losses.generalized_jsd(student, teacher, 0.3, 1.5)
        value.sum().backward()
        results.append((value.detach(), student.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


# -- training


def test_the_student_learns_the_teacher_and_the_teacher_stays(tiny_model_dir, teacher_dir, data, tmp_path):
    teacher_weights = load_file(f"{teacher_dir}/model.safetensors")
    trainer = distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path / "out", "--max_steps", "6",
                                 "--logging_steps", "1", "--val_size", "0.25", "--distill_loss", "jsd"))
    trained = losses_of(trainer)
    assert len(trained) == 6 and all(math.isfinite(x) for x in trained) and trained[-1] < trained[0]
    lora_b = {k: v for k, v in trainer.model.state_dict().items() if "lora_B" in k}
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b.values())  # B starts at zero
    assert not any(p.requires_grad for p in trainer.teacher.parameters())
    assert not trainer.teacher.training
    state = trainer.teacher.state_dict()
    assert set(teacher_weights) <= set(state)  # and the tied output head, which the file stores once
    for name, value in teacher_weights.items():
        assert torch.equal(state[name], value), name
    # evaluation: the student's SFT loss on the held-out replies, and its KL to the teacher
    final = trainer.state.log_history[-1]
    assert final["eval_kl"] > 0 and final["eval_distill_loss"] > 0 and final["eval_loss"] > 0
    assert final["eval_perplexity"] == pytest.approx(math.exp(final["eval_loss"]))
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()
    record = json.loads((tmp_path / "out" / "tunesmith_config.json").read_text())
    assert record["DistillArguments"]["teacher_model_name_or_path"] == teacher_dir


def test_a_teacher_loaded_in_4_bits_teaches(tiny_model_dir, chatty_model_dir, data, tmp_path):
    import bitsandbytes as bnb

    # a teacher of hidden size 64 (bitsandbytes' CPU kernels refuse the 96-wide teacher's shapes)
    trainer = distill_main(flags(tiny_model_dir, chatty_model_dir, data, tmp_path / "out",
                                 "--teacher_quantization_bit", "4"))
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in trainer.teacher.modules())
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in trainer.model.modules())  # the student as asked
    assert all(math.isfinite(x) for x in losses_of(trainer)) and len(losses_of(trainer)) == 2


def test_eval_kl_is_the_forward_kl_of_the_training_loss(tiny_model_dir, teacher_dir, data, tmp_path):
    trainer = distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path / "out", "--max_steps", "1",
                                 "--val_size", "0.25"))
    final = trainer.state.log_history[-1]
    assert final["eval_kl"] == pytest.approx(final["eval_distill_loss"], rel=1e-9)  # forward_kl at temperature 1


def test_packed_and_padded_runs_train_the_same_objective(tiny_model_dir, teacher_dir, data, tmp_path):
    """The teacher gets the packed row with the student's position ids and boundaries: its attention stays within
    each conversation, so the losses and gradient norms are those of padded batches."""
    histories = {}
    for name, packing in (("padded", ["--packing", "false"]), ("packed", ["--packing", "true"])):
        trainer = distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path / name, *packing,
                                     "--logging_steps", "1", "--gradient_accumulation_steps", "2",
                                     "--train_sampling_strategy", "sequential", "--distill_loss", "reverse_kl"))
        histories[name] = [h for h in trainer.state.log_history if "loss" in h]
    assert len(histories["padded"]) == 2
    for a, b in zip(histories["padded"], histories["packed"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
        assert b["trained_tokens"] == a["trained_tokens"]


def test_resume_continues_the_same_trajectory(tiny_model_dir, teacher_dir, data, tmp_path, monkeypatch, caplog):
    common = ("--max_steps", "4", "--lr_scheduler_type", "constant", "--save_strategy", "steps", "--save_steps", "2",
              "--logging_steps", "1", "--per_device_train_batch_size", "2", "--sft_weight", "0.3")
    straight = distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path / "straight", *common))
    distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path / "resumed", *common, "--max_steps", "2"))
    computed = []
    original = DistillTrainer.compute_loss
    monkeypatch.setattr(DistillTrainer, "compute_loss",
                        lambda self, *a, **k: computed.append(1) or original(self, *a, **k))
    caplog.set_level(logging.INFO, logger="tunesmith")
    resumed = distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path / "resumed", *common))
    assert f"resuming from {tmp_path / 'resumed' / 'checkpoint-2'} (step 2)" in caplog.messages
    assert len(computed) == 2
    assert losses_of(resumed) == pytest.approx(losses_of(straight), rel=1e-4)
    assert len(losses_of(resumed)) == 4


# -- on-policy steps (GKD's lambda)


def test_on_policy_steps_train_on_the_students_replies_sampled_by_the_engine(tiny_model_dir, teacher_dir, data,
                                                                            tmp_path, monkeypatch):
    from tunesmith.generation import Engine

    calls = []
    generate = Engine.generate

    def recorded(engine, prompts, params, *args, **kwargs):
        completions = generate(engine, prompts, params, *args, **kwargs)
        calls.append((engine.model, [list(p) for p in prompts], params, [c[0] for c in completions]))
        return completions

    monkeypatch.setattr(Engine, "generate", recorded)
    trainer = distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path / "out", "--lmbda", "1",
                                 "--on_policy_max_new_tokens", "5", "--packing", "true", "--logging_steps", "1"))
    assert trainer.on_policy_steps == 2 and len(calls) == 2
    tokenizer = trainer.processing_class
    replies = 0
    for model, prompts, params, completions in calls:
        assert model is trainer.model and params.max_new_tokens == 5 and len(prompts) == 3
        # the conversation up to its last reply, whose header opens the student's turn
        assert all(tokenizer.decode(p).endswith("<|im_start|>assistant\n") and "You're welcome" not in
                   tokenizer.decode(p) for p in prompts)
        replies += sum(len(c.token_ids) + (c.stop_token_id is not None) for c in completions)
    # exactly the sampled replies trained (the tiny student never ends its turn within 5 tokens)
    assert trainer.state.log_history[1]["trained_tokens"] == replies == 2 * 3 * 5


def test_the_on_policy_coin_follows_the_seed_and_the_step(untrained):
    untrained.lmbda = 0.5
    try:
        draws = [untrained.on_policy_step(step) for step in range(40)]
        assert draws == [untrained.on_policy_step(step) for step in range(40)]  # a resumed run draws the same
        assert 10 < sum(draws) < 30
    finally:
        untrained.lmbda = 0.0


def test_a_packed_row_gives_back_the_examples_of_the_padded_batch(untrained):
    from tunesmith.data.collator import PackingCollator
    from tunesmith.distill.on_policy import examples_of, last_reply_start

    features = [untrained.train_dataset[i] for i in range(3)]
    padded = examples_of(PaddingCollator(untrained.processing_class.pad_token_id)(features))
    packed = examples_of(PackingCollator()(features))
    assert [e["input_ids"] for e in packed] == [e["input_ids"] for e in padded] == [list(f["input_ids"]) for f in features]
    # the packed row's labels lose each example's first token, never trained
    assert [last_reply_start(e["labels"]) for e in packed] == [last_reply_start(e["labels"]) for e in padded]


# -- refusals, one line each, before any weight loads


def parse(*argv: str):
    return parse_run("distill", list(argv))


@pytest.fixture(scope="module")
def other_vocabulary_dir(tmp_path_factory) -> str:
    """A teacher of another tokenizer (a SentencePiece-style one of 1500 tokens)."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("spm"), build_spm_tokenizer(add_prefix=True))


@pytest.fixture(scope="module")
def renumbered_dir(teacher_dir, tmp_path_factory) -> str:
    """The teacher with two tokens' ids swapped in its tokenizer.json: the same vocab_size, another vocabulary."""
    folder = tmp_path_factory.mktemp("renumbered") / "teacher"
    shutil.copytree(teacher_dir, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return str(folder)


def test_a_teacher_of_another_vocabulary_is_refused_naming_both(tiny_model_dir, other_vocabulary_dir,
                                                                 renumbered_dir, data, tmp_path):
    base = ("--model_name_or_path", tiny_model_dir, "--data_path", data, "--output_dir", str(tmp_path / "o"))
    with pytest.raises(ConfigError, match=rf"the teacher {other_vocabulary_dir} and the student {tiny_model_dir} do "
                       r"not share a vocabulary \(vocab_size 49152 and \d+ in their config.json\)"):
        parse(*base, "--teacher_model_name_or_path", other_vocabulary_dir)
    with pytest.raises(ConfigError, match=r"do not share a vocabulary \(2 tokens of their tokenizers differ in id or "
                       r"presence, e.g. 'hello'\)"):
        parse(*base, "--teacher_model_name_or_path", renumbered_dir)


def test_the_default_student_is_checked_once_its_folder_is_known(other_vocabulary_dir, data, tmp_path,
                                                                  default_model_path):
    with pytest.raises(ConfigError, match=rf"the teacher {other_vocabulary_dir} and the student "
                       rf"{default_model_path} do not share a vocabulary"):
        distill_main(["--teacher_model_name_or_path", other_vocabulary_dir, "--data_path", data,
                      "--output_dir", str(tmp_path / "o")])


@pytest.mark.parametrize("extra, error, message", [
    ((), ConfigError, r"--teacher_model_name_or_path is required: the model to distill from"),
    (("--teacher_model_name_or_path", "/no/such/teacher"), PathError,
     r"--teacher_model_name_or_path /no/such/teacher: .*; give a local model folder"),
    (("--teacher_adapter_name_or_path", "/no/such/adapter"), PathError,
     r"--teacher_adapter_name_or_path /no/such/adapter: no such directory"),
    (("--teacher_quantization_bit", "3"), ConfigError, r"--teacher_quantization_bit must be 4 or 8 \(got 3\)"),
    (("--distill_loss", "jsd", "--beta", "1.5"), ConfigError, r"--beta must be in \[0, 1\] \(got 1.5\)"),
    (("--beta", "0.2"), ConfigError, r"--beta 0.2 is read by --distill_loss jsd only \(got --distill_loss forward_kl"),
    (("--distill_temperature", "0"), ConfigError, r"--distill_temperature must be > 0 \(got 0.0\)"),
    (("--sft_weight", "-1"), ConfigError, r"--sft_weight must be >= 0 \(got -1.0\)"),
    (("--lmbda", "1.5"), ConfigError, r"--lmbda must be in \[0, 1\] \(got 1.5\)"),
    (("--lmbda", "0.5", "--on_policy_max_new_tokens", "0"), ConfigError,
     r"--on_policy_max_new_tokens must be at least 1 \(got 0\) with --lmbda 0.5"),
    (("--finetuning_type", "prompt_tuning"), ConfigError,
     r"--finetuning_type prompt_tuning cannot be distilled into"),
    (("--teacher_quantization_bit", "4", "--deepspeed", "configs/ds_zero3.json"), ConfigError,
     r"--teacher_quantization_bit 4 cannot be used with ZeRO-3, .* or use configs/ds_zero2.json"),
    (("--teacher_quantization_bit", "8", "--deepspeed", "configs/ds_zero3.json"), ConfigError,
     r"--teacher_quantization_bit 8 cannot be used with ZeRO-3"),
    (("--teacher_dtype", "float32", "--bf16", "true", "--deepspeed", "configs/ds_zero3.json"), ConfigError,
     r"--teacher_dtype float32 cannot be kept under ZeRO-3, which holds the teacher in the run's precision "
     r"\(bfloat16, from --bf16/--fp16\)"),
    (("--label_smoothing_factor", "0.1"), ConfigError,
     r"--label_smoothing_factor 0.1 would do nothing in tunesmith distill"),
    (("--sequence_parallel_size", "2", "--deepspeed", "configs/ds_zero2.json", "--packing", "true"), ConfigError,
     r"--sequence_parallel_size 2: tunesmith distill does not cut rows across ranks"),
], ids=["teacher-given", "teacher-path", "teacher-adapter-path", "teacher-bits", "beta-range", "beta-unread",
        "temperature", "sft-weight", "lmbda", "on-policy-tokens", "prompt-tuning", "zero3-teacher-4bit",
        "zero3-teacher-8bit", "zero3-teacher-dtype", "label-smoothing", "sequence-parallel"])
def test_settings_that_cannot_work_are_refused_in_one_line(tiny_model_dir, teacher_dir, data, tmp_path, extra,
                                                           error, message, monkeypatch):
    monkeypatch.setattr(rules, "_world_size", lambda: 2)  # as under torchrun's two ranks, which can cut rows in two
    teacher = () if extra and extra[0] in ("--teacher_model_name_or_path",) else \
        ("--teacher_model_name_or_path", teacher_dir)
    argv = ["--model_name_or_path", tiny_model_dir, "--data_path", data, "--output_dir", str(tmp_path / "o"),
            *(teacher if extra else ()), *extra]
    with pytest.raises(error, match=message) as refused:
        parse(*argv)
    assert "\n" not in str(refused.value)


def test_an_adapter_folder_as_the_teacher_is_that_adapter_on_its_base(tiny_model_dir, teacher_dir, tokenizer,
                                                                       data, tmp_path):
    from tests.helpers.tiny_models import save_random_adapter

    adapter = save_random_adapter(teacher_dir, tokenizer, str(tmp_path / "adapter"), seed=3)
    run = parse("--model_name_or_path", tiny_model_dir, "--teacher_model_name_or_path", adapter, "--data_path", data,
                "--output_dir", str(tmp_path / "o"))
    assert (run.distill.teacher_model_name_or_path, run.distill.teacher_adapter_name_or_path) == (teacher_dir, adapter)


# -- DeepSpeed: one process, two CPU ranks


def history_of(out) -> list[dict]:
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def assert_the_students_adapter_only(out, student: str) -> None:
    """The output holds the student's adapter, complete (no ZeRO-3 placeholder saved), and nothing of the teacher:
    no model weights, and only LoRA weights of the student's shapes, which load onto the student's base."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tunesmith.train.checkpoints import empty_tensors

    assert sorted(p.name for p in out.glob("*.safetensors")) == ["adapter_model.safetensors"]
    assert not empty_tensors(str(out)) and not list(out.glob("*model*.bin"))
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(student), str(out))
    loaded = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    assert {k: v.shape for k, v in saved.items()} == {k: loaded[k].shape for k in saved} and len(loaded) == len(saved)


@pytest.mark.heavy  # ~2.5 min loaded; the default tier's two-rank distill runs cover ZeRO-3; -m heavy
def test_one_process_under_zero3_trains_as_without_deepspeed(tiny_model_dir, teacher_dir, data, tmp_path):
    """`python distill/train.py --deepspeed configs/ds_zero3.json`: the teacher in its own ZeRO-3 engine and the
    student's on-policy replies generated from its sharded weights give the losses, trained tokens and held-out KL
    of the same run without DeepSpeed, and a complete adapter of the student only."""
    import os
    import subprocess
    import sys

    from tests.system.test_distributed import ROOT

    common = ("--max_steps", "2", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--val_size", "0.25",
              "--lmbda", "1", "--on_policy_max_new_tokens", "5", "--packing", "true", "--lr_scheduler_type",
              "constant")
    plain = distill_main(flags(tiny_model_dir, teacher_dir, data, tmp_path / "plain", *common)).state.log_history
    out = tmp_path / "zero3"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    proc = subprocess.run([sys.executable, str(ROOT / "distill/train.py"),
                           *flags(tiny_model_dir, teacher_dir, data, out, *common, "--deepspeed",
                                  "configs/ds_zero3.json")],
                          capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    zero3 = history_of(out)
    steps = [[(r["loss"], r["trained_tokens"]) for r in h if "loss" in r] for h in (plain, zero3)]
    assert len(steps[1]) == 2 and steps[1][1][1] == 2 * 4 * 5  # both steps on the student's 5-token replies
    assert [loss for loss, _ in steps[1]] == pytest.approx([loss for loss, _ in steps[0]], rel=1e-4)
    assert [n for _, n in steps[1]] == [n for _, n in steps[0]]
    assert zero3[-1]["eval_kl"] == pytest.approx(plain[-1]["eval_kl"], rel=1e-4)
    assert_the_students_adapter_only(out, tiny_model_dir)


def two_ranks_and_one(student: str, teacher: str, data: str, tmp_path, config: str) -> dict[int, tuple]:
    """{ranks: (losses, eval_kl, output folder)} of one rank at batch 4 and two ranks at batch 2 (torchrun, gloo)."""
    from tests.system.test_distributed import launch

    results = {}
    for ranks, batch in ((1, "4"), (2, "2")):
        out = tmp_path / f"ranks{ranks}"
        launch("distill/train.py", ranks, *flags(student, teacher, data, out, "--max_steps", "2",
                                                 "--per_device_train_batch_size", batch, "--logging_steps", "1",
                                                 "--val_size", "0.25", "--distill_loss", "jsd",
                                                 "--deepspeed", f"configs/{config}", "--lr_scheduler_type",
                                                 "constant"))
        history = history_of(out)
        results[ranks] = ([r["loss"] for r in history if "loss" in r], history[-1]["eval_kl"], out)
    return results


# heavy tier, as test_distributed.py's ZeRO-2 torchrun run: 214 s for the two launches on the shared 2-core machine
@pytest.mark.distributed
@pytest.mark.heavy
def test_two_ranks_under_zero2_follow_one_rank(tiny_model_dir, teacher_dir, data, tmp_path):
    """Two ranks (torchrun, gloo, DeepSpeed ZeRO-2) at the one-rank run's global batch: the same losses, the same
    held-out KL to the teacher (summed over both ranks' shares of the set), and a complete adapter."""
    from tunesmith.train.checkpoints import empty_tensors

    results = two_ranks_and_one(tiny_model_dir, teacher_dir, data, tmp_path, "ds_zero2.json")
    for _, _, out in results.values():
        assert not empty_tensors(str(out)) and (out / "adapter_model.safetensors").exists()
    assert results[2][0] == pytest.approx(results[1][0], rel=2e-3) and len(results[2][0]) == 2
    assert results[2][1] == pytest.approx(results[1][1], rel=1e-3)


# heavy tier, as the ZeRO-2 run: three launches, the third GKD's on-policy steps on two ranks
@pytest.mark.distributed
@pytest.mark.heavy
def test_two_ranks_under_zero3_follow_one_rank_with_a_sharded_teacher(tiny_model_dir, teacher_dir, data, tmp_path):
    """Two ranks under ZeRO-3, each holding half of the teacher (gathered by its own DeepSpeed engine in each
    forward), at the one-rank run's global batch: the same losses and held-out KL, the student's adapter complete
    and the teacher saved nothing. Then on-policy steps: both ranks sample from the sharded student in step."""
    from tests.system.test_distributed import launch

    results = two_ranks_and_one(tiny_model_dir, teacher_dir, data, tmp_path, "ds_zero3.json")
    for _, _, out in results.values():
        assert_the_students_adapter_only(out, tiny_model_dir)
    assert results[2][0] == pytest.approx(results[1][0], rel=2e-3) and len(results[2][0]) == 2
    assert results[2][1] == pytest.approx(results[1][1], rel=1e-3)

    out = tmp_path / "on_policy"
    launch("distill/train.py", 2, *flags(tiny_model_dir, teacher_dir, data, out, "--max_steps", "2",
                                         "--per_device_train_batch_size", "2", "--logging_steps", "1", "--lmbda", "1",
                                         "--on_policy_max_new_tokens", "5", "--deepspeed", "configs/ds_zero3.json"))
    steps = [r for r in history_of(out) if "loss" in r]
    # every step on the student's 5-token replies (the tiny student never ends its turn so soon), both ranks' counted
    assert [r["trained_tokens"] for r in steps] == [20, 40] and all(math.isfinite(r["loss"]) for r in steps)
    assert_the_students_adapter_only(out, tiny_model_dir)
