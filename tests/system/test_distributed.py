"""Two CPU ranks (gloo) under torchrun and the deepspeed launcher with DeepSpeed ZeRO-2 and ZeRO-3 (and their
offload configs), for SFT, the reward model, DPO, PPO and GRPO: runs train, saves are complete and load back
with plain transformers/peft, and two ranks follow the one-rank run at the same global batch."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tunesmith.train.checkpoints import empty_tensors

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]
CONVERSATIONS = [
    [{"role": "user", "content": f"Spell {w}."}, {"role": "assistant", "content": " ".join(w.upper())}]
    for w in ["cat", "dog", "tea", "sun", "map", "owl", "pen", "cup"]
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("dist") / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in CONVERSATIONS))
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCHERS = {
    "torchrun": lambda ranks, port: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                                     "--master_port", str(port)],
    "deepspeed": lambda ranks, port: [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(ranks),
                                      "--master_port", str(port)],
}


def launch(script: str, ranks: int, *args: str, launcher: str = "torchrun", env: dict[str, str] | None = None) -> str:
    """Run a stage script under a distributed launcher (env: added to this process's environment); its stderr."""
    port = free_port()
    cmd = [*LAUNCHERS[launcher](ranks, port), str(ROOT / script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # DeepSpeed's CPU allreduce maps a 66 MB shared-memory segment per rank, which each rank unlinks once its
    # process group is gone (boundary.release_allreduce_buffer): none of this run's may stay behind in /dev/shm
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    return proc.stderr


def train(model_dir: str, data: str, out: Path, ranks: int, *extra: str, launcher: str = "torchrun") -> list[float]:
    """Run sft/train.py under a distributed launcher; the logged losses."""
    launch("sft/train.py", ranks,
           "--model_name_or_path", model_dir, "--data_path", data, "--output_dir", str(out),
           "--max_steps", "3", "--learning_rate", "5e-3", "--lr_scheduler_type", "constant",
           "--save_strategy", "no", "--plot_loss", "false", "--lora_dropout", "0.0", "--seed", "0", *extra,
           launcher=launcher)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [r["loss"] for r in history if "loss" in r]


@pytest.mark.parametrize(
    "config, launcher, quantization",
    # ZeRO-2 with torchrun: heavy tier (92 s of a two-process default run); the default tier's reward, DPO and
    # GRPO runs save LoRA adapters under ZeRO-2 with torchrun.
    [pytest.param("ds_zero2.json", "torchrun", (), marks=pytest.mark.heavy), ("ds_zero3.json", "deepspeed", ()),
     # QLoRA under ZeRO-3: heavy tier (~2 min loaded); ZeRO-3's adapter save is the deepspeed-launcher row's
     pytest.param("ds_zero3.json", "torchrun", ("--quantization_bit", "4"), marks=pytest.mark.heavy),
     # Offload on a CPU machine: the Trainer's own AdamW steps in CPU memory (transformers sets
     # zero_force_ds_cpu_optimizer false). DeepSpeed still builds its cpu_adam op on the first offload run of a
     # fresh environment (about 50 s on 2 cores, then cached in ~/.cache/torch_extensions), which is most of
     # these tests' time in CI: the opt-in tier (-m heavy).
     pytest.param("ds_zero2_offload.json", "torchrun", (), marks=pytest.mark.heavy),
     pytest.param("ds_zero3_offload.json", "deepspeed", (), marks=pytest.mark.heavy)],
    ids=["zero2-torchrun", "zero3-deepspeed-launcher", "zero3-qlora4", "zero2-offload", "zero3-offload"],
)
def test_two_rank_lora_saves_complete_adapter(tiny_model_dir, data, tmp_path, config, launcher, quantization):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    losses = train(tiny_model_dir, data, out, 2, "--per_device_train_batch_size", "2",
                   "--deepspeed", str(ROOT / "configs" / config), *quantization, launcher=launcher)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    if quantization:  # ZeRO-3 gathers the 4-bit weights for each forward: the one-process QLoRA run's losses
        # (measured: 10.7136, 10.7660, 10.5759 without DeepSpeed, 10.7143, 10.7677, 10.5767 on two ZeRO-3 ranks)
        plain = train(tiny_model_dir, data, tmp_path / "plain", 1, "--per_device_train_batch_size", "4",
                      *quantization)
        assert losses == pytest.approx(plain, rel=1e-3)
    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(out))
    loaded = {k: v for k, v in model.state_dict().items() if "lora_B" in k}
    assert len(loaded) == sum("lora_B" in k for k in saved)


def test_two_rank_zero3_full_model_is_complete(tiny_model_dir, data, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "full"
    train(tiny_model_dir, data, out, 2, "--per_device_train_batch_size", "2", "--finetuning_type", "full",
          "--learning_rate", "1e-3", "--deepspeed", str(ROOT / "configs/ds_zero3.json"))
    assert empty_tensors(str(out)) == []
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert {k: v.shape for k, v in after.items()} == {k: v.shape for k, v in before.items()}
    assert not torch.equal(after["model.layers.0.self_attn.q_proj.weight"], before["model.layers.0.self_attn.q_proj.weight"])


def test_two_ranks_match_one_rank_at_same_global_batch(tiny_model_dir, data, tmp_path):
    zero2 = ("--deepspeed", str(ROOT / "configs/ds_zero2.json"))
    one = train(tiny_model_dir, data, tmp_path / "one", 1, "--per_device_train_batch_size", "4", *zero2)
    two = train(tiny_model_dir, data, tmp_path / "two", 2, "--per_device_train_batch_size", "2", *zero2)
    assert two == pytest.approx(one, rel=2e-3)
    assert one[-1] < one[0]


def test_two_ranks_evaluate_the_whole_set_as_one(tiny_model_dir, data, tmp_path):
    """SFT's eval_loss is the loss per predicted token of the whole evaluation set, summed over the ranks
    (each scores half of it): an unchanged model (learning rate 0) gets the one-rank value on two ranks."""
    evaluated = []
    for ranks in (1, 2):
        out = tmp_path / f"ranks{ranks}"
        train(tiny_model_dir, data, out, ranks, "--eval_data_path", data, "--per_device_eval_batch_size", "2",
              "--max_steps", "1", "--learning_rate", "0")
        evaluated.append(json.loads((out / "eval_results.json").read_text()))
    one, two = evaluated
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-6)
    assert two["eval_perplexity"] == pytest.approx(math.exp(one["eval_loss"]), rel=1e-6)


# --------------------------------------------------------------------------- reward model

QUESTIONS = ["What is 2 + 2?", "Capital of France?", "Can you help me?", "Say something nice."]
GOOD = ["Sure! It is four.", "Happy to help: Paris.", "Of course, gladly.", "You are doing great."]
BAD = ["No.", "Figure it out.", "Stop asking.", "Go away."]


def pair(i: int) -> dict:
    return {"prompt": [{"role": "user", "content": QUESTIONS[i % 4]}],
            "chosen": [{"role": "assistant", "content": GOOD[i % 4]}],
            "rejected": [{"role": "assistant", "content": BAD[(i + 1) % 4]}]}


@pytest.fixture(scope="module")
def preference_data(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("pairs")
    files = {"train": [pair(i) for i in range(8)], "eval": [pair(i) for i in range(4)]}
    for name, rows in files.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {name: str(folder / f"{name}.jsonl") for name in files}


# The ZeRO-3 case is in the heavy tier (its save gathers as the default tier's ZeRO-3 LoRA test does).
@pytest.mark.parametrize("config, launcher", [("ds_zero2.json", "torchrun"),
                                              pytest.param("ds_zero3.json", "deepspeed", marks=pytest.mark.heavy)],
                         ids=["zero2-torchrun", "zero3-deepspeed-launcher"])
def test_two_rank_reward_adapter_saves_its_trained_score_head(tiny_model_dir, preference_data, tmp_path, config,
                                                              launcher):
    from transformers import AutoModelForSequenceClassification, set_seed

    from tunesmith.preference import score

    out = tmp_path / "rm"
    launch("reward/train.py", 2, "--model_name_or_path", tiny_model_dir, "--data_path", preference_data["train"],
           "--eval_data_path", preference_data["eval"], "--output_dir", str(out), "--max_steps", "2",
           "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2", "--learning_rate", "5e-3",
           "--lora_r", "8", "--lora_dropout", "0.0", "--max_seq_length", "64", "--save_strategy", "no",
           "--plot_loss", "false", "--report_to", "none", "--seed", "0",
           "--deepspeed", str(ROOT / "configs" / config), launcher=launcher)
    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    head = [v for k, v in saved.items() if "score" in k]
    assert len(head) == 1 and head[0].shape == (1, 64)
    # The head drawn at the start of the run (seed 0), moved by two Adam steps of about 5e-3 and 2.5e-3
    # per weight. An untrained head would not have moved; another random one would be ~0.05 away.
    set_seed(0)
    initial = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).score.weight
    assert 1e-3 < (head[0] - initial).abs().max() < 1e-2

    # The evaluation at the end of the run (each rank scored half of the pairs) saw the scores the saved
    # adapter gives in one process.
    results = score.run(["--model_name_or_path", str(out), "--data_path", preference_data["eval"],
                          "--output_file", str(tmp_path / "scores.jsonl")])
    chosen, rejected = (torch.tensor([r[side] for r in results]) for side in ("chosen", "rejected"))
    metrics = json.loads((out / "eval_results.json").read_text())
    assert metrics["eval_chosen_score"] == pytest.approx(chosen.mean().item(), abs=1e-4)
    assert metrics["eval_rejected_score"] == pytest.approx(rejected.mean().item(), abs=1e-4)
    assert torch.isfinite(chosen).all() and chosen.std() > 0


# --------------------------------------------------------------------------- DPO

def dpo_flags(model_dir: str, data: dict[str, str], out: Path, batch: int) -> list[str]:
    return ["--model_name_or_path", model_dir, "--data_path", data["train"], "--eval_data_path", data["eval"],
            "--output_dir", str(out), "--max_steps", "3", "--per_device_train_batch_size", str(batch),
            "--per_device_eval_batch_size", "2", "--learning_rate", "5e-3", "--lr_scheduler_type", "constant",
            "--beta", "0.5", "--lora_r", "8", "--lora_dropout", "0.0", "--max_seq_length", "64",
            "--logging_steps", "1", "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none",
            "--seed", "0"]


@pytest.fixture(scope="module")
def one_process_dpo_losses(tiny_model_dir, preference_data, tmp_path_factory) -> list[float]:
    from tunesmith.preference import command as dpo

    trainer = dpo.run(dpo_flags(tiny_model_dir, preference_data, tmp_path_factory.mktemp("dpo") / "one", 4))
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


@pytest.mark.parametrize("config, launcher, extra", [
    ("ds_zero2.json", "torchrun", ("--precompute_ref_logps", "true")),
    pytest.param("ds_zero3.json", "deepspeed", (), marks=pytest.mark.heavy),  # heavy tier, as for reward
], ids=["zero2-torchrun-precomputed", "zero3-deepspeed-launcher"])
def test_two_rank_dpo_follows_one_rank_and_saves_a_complete_adapter(tiny_model_dir, preference_data,
                                                                    one_process_dpo_losses, tmp_path, config, launcher,
                                                                    extra):
    """Two ranks of 2 pairs follow one process of 4 pairs: the reference (the model without its adapter,
    sharded like the policy under ZeRO-3; or precomputed, each rank scoring half the pairs) and the
    loss agree. The adapter saves whole and loads with plain peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "two"
    launch("dpo/train.py", 2, *dpo_flags(tiny_model_dir, preference_data, out, 2), *extra,
           "--deepspeed", str(ROOT / "configs" / config), launcher=launcher)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    two_losses = [r["loss"] for r in history if "loss" in r]
    assert two_losses[0] == pytest.approx(math.log(2), abs=1e-4)  # a new adapter starts as its reference
    assert two_losses == pytest.approx(one_process_dpo_losses, rel=2e-3)
    assert two_losses[-1] < two_losses[0]
    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(out))
    assert sum("lora_B" in k for k in model.state_dict()) == sum("lora_B" in k for k in saved)


# --------------------------------------------------------------------------- PPO

WORDS = ["cat", "blue sky", "seven", "a long walk home", "tea", "why not", "rivers and lakes", "ok"]
TIME_KEYS = {"time_generate", "time_score", "time_train"}


@pytest.fixture(scope="module")
def ppo_data(tmp_path_factory, tokenizer) -> dict[str, str]:
    """Prompts, and a tiny random reward model (a whole model) whose scores differ from prompt to prompt."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    folder = tmp_path_factory.mktemp("ppo-data")
    (folder / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"Say {w}."}) + "\n" for w in WORDS))
    torch.manual_seed(2)
    # initializer_range 0.2 (not 0.02): every scored sequence ends with the same template tokens, and
    # only larger weights carry enough of the prompt to the last position to tell prompts apart.
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, initializer_range=0.2,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForSequenceClassification(config).save_pretrained(folder / "rm")
    tokenizer.save_pretrained(folder / "rm")
    return {"prompts": str(folder / "prompts.jsonl"), "reward_model": str(folder / "rm")}


def ppo_flags(model_dir: str, data: dict[str, str], out: Path, batch: int, steps: int) -> list[str]:
    # top_k 1: greedy replies, so runs that see the same prompts get the same replies and scores at step 1.
    return ["--model_name_or_path", model_dir, "--reward_model", data["reward_model"], "--data_path", data["prompts"],
            "--output_dir", str(out), "--per_device_train_batch_size", str(batch), "--max_new_tokens", "6",
            "--top_k", "1", "--ppo_epochs", "2", "--num_mini_batches", "2", "--max_steps", str(steps),
            "--lora_r", "4", "--learning_rate", "1e-2", "--save_strategy", "no", "--report_to", "none",
            "--rollout_log_samples", "0", "--seed", "0"]


def ppo_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def one_rank_first_step(tiny_model_dir, ppo_data, tmp_path_factory) -> dict:
    """Step 1 of a one-process run over rollout batches of 4 prompts."""
    from tunesmith.rl.command import run

    out = tmp_path_factory.mktemp("ppo-one-rank")
    run(ppo_flags(tiny_model_dir, ppo_data, out, 4, 1))
    return ppo_log(out)[0]


def run_two_rank_ppo(model_dir: str, data: dict[str, str], out: Path, config: str, launcher: str, steps: int,
                     *extra: str) -> list[dict]:
    stderr = launch("ppo/train.py", 2, *ppo_flags(model_dir, data, out, 2, steps),
                    "--deepspeed", str(ROOT / "configs" / config), *extra, launcher=launcher)
    stage = json.loads((ROOT / "configs" / config).read_text())["zero_optimization"]["stage"]
    assert f"PPO on 2 process(es), distributed type DEEPSPEED ZeRO-{stage}" in stderr
    return ppo_log(out)


def check_ppo_output(out: Path, model_dir: str, log: list[dict], one_rank_first_step: dict) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert all(math.isfinite(r[k]) for r in log for k in ("score", "kl", "policy_loss", "value_loss", "grad_norm"))
    # Two ranks of 2 prompts see the 4 prompts one rank sees: the same greedy replies, the same scores.
    for key in ("score", "score_std", "reward", "entropy"):
        assert log[0][key] == pytest.approx(one_rank_first_step[key], abs=1e-5), key

    assert empty_tensors(str(out)) == [] and empty_tensors(str(out / "value")) == []
    # LoRA B and the value head start at zero: nonzero saved values are trained ones, gathered whole.
    for folder in (out, out / "value"):
        saved = load_file(str(folder / "adapter_model.safetensors"))
        assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items()), folder
    head = load_file(str(out / "value_head.safetensors"))["weight"]
    assert head.shape == (1, 64) and head.abs().sum() > 0
    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(out))
    policy.load_adapter(str(out / "value"), adapter_name="value")
    assert {"default", "value"} <= set(policy.peft_config)


@pytest.mark.heavy  # the default tier has PPO under ZeRO-3 (synced generation) and GRPO under ZeRO-2
def test_two_rank_ppo_zero2(tiny_model_dir, ppo_data, one_rank_first_step, tmp_path):
    out = tmp_path / "ppo"
    log = run_two_rank_ppo(tiny_model_dir, ppo_data, out, "ds_zero2.json", "deepspeed", 2)
    assert [r["step"] for r in log] == [1, 2]
    check_ppo_output(out, tiny_model_dir, log, one_rank_first_step)


def test_two_rank_ppo_zero3_generates_synced_saves_gathered_and_resumes(tiny_model_dir, ppo_data,
                                                                       one_rank_first_step, tmp_path):
    out = tmp_path / "ppo"
    log = run_two_rank_ppo(tiny_model_dir, ppo_data, out, "ds_zero3.json", "torchrun", 3,
                           "--save_strategy", "steps", "--save_steps", "2")
    assert [r["step"] for r in log] == [1, 2, 3]
    check_ppo_output(out, tiny_model_dir, log, one_rank_first_step)

    # Resuming checkpoint-2 (weights gathered, each rank's ZeRO-3 optimizer shard) repeats step 3 exactly.
    resumed = run_two_rank_ppo(tiny_model_dir, ppo_data, tmp_path / "resumed", "ds_zero3.json", "torchrun", 3,
                               "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert {k: v for k, v in resumed[2].items() if k not in TIME_KEYS} == pytest.approx(
        {k: v for k, v in log[2].items() if k not in TIME_KEYS}, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("config", ["ds_zero2.json", "ds_zero3.json"])
def test_one_process_without_a_launcher_saves_complete_adapter(tiny_model_dir, data, tmp_path, config):
    """`python sft/train.py --deepspeed ...`: no launcher environment, so DeepSpeed would look for MPI."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "sft/train.py"), "--model_name_or_path", tiny_model_dir, "--data_path", data,
         "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "2", "--save_strategy", "no",
         "--plot_loss", "false", "--deepspeed", str(ROOT / "configs" / config)],
        capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert empty_tensors(str(out)) == []
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(out))
    # The logged sizes are the model's, not the sizes of ZeRO-3's in-memory placeholders.
    base = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    logged = re.search(r"parameters: ([\d,]+) trainable of ([\d,]+) ", proc.stderr)
    trainable, total = (int(n.replace(",", "")) for n in logged.groups())
    assert 0 < trainable < base and total == base + trainable, logged.group(0)


# --------------------------------------------------------------------------- GRPO

REWARD_MODULE = '''
def reply_chars(prompts, replies, **fields):
    """Longer replies score higher: random tiny-model replies differ in length, so every group has a spread."""
    return [len(r) / 10 for r in replies]
'''


@pytest.fixture(scope="module")
def grpo_rewards(tmp_path_factory) -> str:
    """A folder holding a reward-function module, for --reward_funcs dist_rewards:reply_chars (via PYTHONPATH)."""
    folder = tmp_path_factory.mktemp("grpo-rewards")
    (folder / "dist_rewards.py").write_text(REWARD_MODULE)
    return str(folder)


def run_two_rank_grpo(model_dir: str, data: dict[str, str], rewards: str, out: Path, config: str, launcher: str,
                      steps: int, *extra: str) -> list[dict]:
    """GRPO with a reward function instead of a reward model: groups of 2 sampled replies per prompt."""
    flags = [a for a in ppo_flags(model_dir, data, out, 2, steps) if a not in ("--reward_model", data["reward_model"])]
    flags[flags.index("--top_k") + 1] = "0"  # sampled, so the two replies of a group differ
    env_path = os.pathsep.join(filter(None, [rewards, os.environ.get("PYTHONPATH")]))
    stderr = launch("ppo/train.py", 2, *flags, "--advantage", "grpo", "--samples_per_prompt", "2", "--kl_in_loss",
                    "true", "--reward_funcs", "dist_rewards:reply_chars", "--deepspeed", str(ROOT / "configs" / config),
                    *extra, launcher=launcher, env={"PYTHONPATH": env_path})
    stage = json.loads((ROOT / "configs" / config).read_text())["zero_optimization"]["stage"]
    assert f"PPO on 2 process(es), distributed type DEEPSPEED ZeRO-{stage}" in stderr
    return ppo_log(out)


def check_grpo_output(out: Path, model_dir: str, log: list[dict]) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert all(math.isfinite(r[k]) for r in log for k in ("score", "kl", "kl_loss", "policy_loss", "grad_norm"))
    assert all("value_loss" not in r for r in log) and log[0]["score_std"] > 0
    assert not (out / "value").exists() and not (out / "value_head.safetensors").exists()
    assert empty_tensors(str(out)) == []
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in saved.items())  # trained, gathered whole
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(out))


def test_two_rank_grpo_zero2(tiny_model_dir, ppo_data, grpo_rewards, tmp_path):
    out = tmp_path / "grpo"
    log = run_two_rank_grpo(tiny_model_dir, ppo_data, grpo_rewards, out, "ds_zero2.json", "deepspeed", 2)
    assert [r["step"] for r in log] == [1, 2]
    check_grpo_output(out, tiny_model_dir, log)


@pytest.mark.heavy  # the default tier has PPO under ZeRO-3 (the same gathered save and resume) and GRPO under ZeRO-2
def test_two_rank_grpo_zero3_saves_gathered_and_resumes(tiny_model_dir, ppo_data, grpo_rewards, tmp_path):
    out = tmp_path / "grpo"
    log = run_two_rank_grpo(tiny_model_dir, ppo_data, grpo_rewards, out, "ds_zero3.json", "torchrun", 3,
                            "--save_strategy", "steps", "--save_steps", "2")
    assert [r["step"] for r in log] == [1, 2, 3]
    check_grpo_output(out, tiny_model_dir, log)
    # Resuming checkpoint-2 (each rank's random state and ZeRO-3 optimizer shard) samples and trains step 3 again.
    resumed = run_two_rank_grpo(tiny_model_dir, ppo_data, grpo_rewards, tmp_path / "resumed", "ds_zero3.json",
                                "torchrun", 3, "--resume_from_checkpoint", str(out / "checkpoint-2"))
    assert {k: v for k, v in resumed[2].items() if k not in TIME_KEYS} == pytest.approx(
        {k: v for k, v in log[2].items() if k not in TIME_KEYS}, rel=1e-4, abs=1e-6)
