"""`--optim muon` (train/muon.py): torch.optim.Muon for the hidden matrices and AdamW for the rest, as one optimizer.
Its step is torch's two optimizers' to the bit; `tunesmith sft` trains with it (full and LoRA, whose A and B go to
Muon), resumes bit-identically, the RL loop's factory call builds it, and what cannot run is refused in one line."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import Trainer

from tunesmith.errors import ConfigError
from tunesmith.hparams import parse_run
from tunesmith.sft.command import run as sft
from tunesmith.train.muon import MuonWithAdamW, mark_muon_weights
from tunesmith.train.optimizers import unwrap_optimizer

ROWS = [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                      {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]} for a in range(4) for b in range(4)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("muon-data") / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def flags(model: str, data: str, out, *extra: str) -> list[str]:
    return ["--model_name_or_path", model, "--data_path", data, "--output_dir", str(out), "--optim", "muon",
            "--max_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
            "--save_strategy", "no", "--plot_loss", "false", "--report_to", "none", "--seed", "0", *extra]


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.hidden = nn.Linear(8, 12)
        self.norm = nn.LayerNorm(12)
        self.lm_head = nn.Linear(12, 10, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.hidden(self.embed(ids))))


def test_the_step_is_torch_muon_and_adamw_to_the_bit():
    torch.manual_seed(0)
    ours, theirs = Toy(), Toy()
    theirs.load_state_dict(ours.state_dict())
    assert mark_muon_weights(ours) == (1, 5)  # hidden.weight; embed, hidden.bias, norm (2), lm_head
    groups = [{"params": list(ours.parameters()), "weight_decay": 0.1}]
    optimizer = MuonWithAdamW(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, muon_args={"momentum": 0.9})
    muon = torch.optim.Muon([theirs.hidden.weight], lr=3e-3, weight_decay=0.1, momentum=0.9,
                            adjust_lr_fn="match_rms_adamw")
    rest = [p for n, p in theirs.named_parameters() if n != "hidden.weight"]
    adamw = torch.optim.AdamW(rest, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ids = torch.randint(0, 10, (4, 5))
    for _ in range(3):
        for model, steps in ((ours, [optimizer]), (theirs, [muon, adamw])):
            model(ids).logsumexp(-1).mean().backward()
            for opt in steps:
                opt.step()
                opt.zero_grad()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(a, b), name
    state = optimizer.state_dict()["state"]
    assert sorted(len(s) for s in state.values()) == [1] + [3] * 5  # Muon's momentum; AdamW's step and moments


def test_full_fine_tuning_trains_with_muon_for_the_hidden_matrices(tiny_model_dir, data, tmp_path):
    before = load_file(f"{tiny_model_dir}/model.safetensors")
    trainer = sft(flags(tiny_model_dir, data, tmp_path / "out", "--finetuning_type", "full"))
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    optimizer = unwrap_optimizer(trainer.optimizer)
    assert isinstance(optimizer, MuonWithAdamW)
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    muon = {names[id(p)] for g in optimizer.param_groups if g["muon"] for p in g["params"]}
    adamw = {names[id(p)] for g in optimizer.param_groups if not g["muon"] for p in g["params"]}
    projections = {n for n in names.values() if n.endswith("proj.weight")}
    assert muon == projections  # every attention and MLP matrix, nothing else
    assert "model.embed_tokens.weight" in adamw and any("norm" in n for n in adamw)
    assert {n for n in adamw if trainer.model.get_parameter(n).ndim == 2} == {"model.embed_tokens.weight"}  # tied head
    for group in optimizer.param_groups:
        for p in group["params"]:
            assert set(optimizer.state[p]) == ({"momentum_buffer"} if group["muon"] else {"step", "exp_avg", "exp_avg_sq"})
    after = trainer.model.state_dict()
    assert all(not torch.equal(after[k], before[k]) for k in ("model.layers.0.mlp.up_proj.weight",
                                                              "model.embed_tokens.weight"))


def test_lora_a_and_b_train_with_muon(tiny_model_dir, data, tmp_path):
    trainer = sft(flags(tiny_model_dir, data, tmp_path / "out", "--lora_learning_rate", "5e-3"))
    optimizer = unwrap_optimizer(trainer.optimizer)
    names = {id(p): n for n, p in trainer.model.named_parameters() if p.requires_grad}
    muon = [names[id(p)] for g in optimizer.param_groups if g["muon"] for p in g["params"]]
    assert sorted(muon) == sorted(names.values()) and all(".lora_" in n for n in muon)
    assert {g["initial_lr"] for g in optimizer.param_groups} == {5e-3}  # --lora_learning_rate split the halves
    assert all(n.endswith(".weight") and trainer.model.get_parameter(n).abs().sum() > 0 for n in muon if "lora_B" in n)


def test_resume_is_bit_identical(tiny_model_dir, data, tmp_path):
    common = ("--finetuning_type", "full", "--max_steps", "4", "--lr_scheduler_type", "constant", "--save_strategy",
              "steps", "--save_steps", "2", "--per_device_train_batch_size", "2", "--learning_rate", "3e-3")
    straight = sft(flags(tiny_model_dir, data, tmp_path / "straight", *common))
    sft(flags(tiny_model_dir, data, tmp_path / "resumed", *common, "--max_steps", "2"))
    resumed = sft(flags(tiny_model_dir, data, tmp_path / "resumed", *common))

    def losses(trainer) -> list[float]:
        return [r["loss"] for r in trainer.state.log_history if "loss" in r]

    assert losses(resumed)[2:] == losses(straight)[2:]
    expected, got = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    a, b = unwrap_optimizer(straight.optimizer).state_dict(), unwrap_optimizer(resumed.optimizer).state_dict()
    assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i])


def test_the_rl_loop_builds_it_through_transformers_factory(tiny_model_dir):
    # rl/trainer.py: Trainer.get_optimizer_cls_and_kwargs(training_args), then the class on its param groups
    from transformers import AutoModelForCausalLM

    training = parse_run("ppo", ["--reward_model", tiny_model_dir, "--data_path", "x.jsonl", "--optim", "muon",
                                 "--optim_args", "momentum=0.9,adjust_lr_fn=original"], check_paths=False).training
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(training)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    mark_muon_weights(model)
    optimizer = optimizer_cls([{"params": list(model.parameters()), "weight_decay": 0.0}], **kwargs)
    muon = [g for g in optimizer.param_groups if g["muon"]]
    assert muon and all(g["momentum"] == 0.9 and g["adjust_lr_fn"] == "original" for g in muon)
    assert sum(len(g["params"]) for g in muon) == 2 * 7  # q, k, v, o, gate, up, down of each layer


def test_heads_on_top_of_the_model_train_with_adamw(tiny_model_dir):
    # a reward model's score head is 2-D, but it is a head: AdamW (as the embeddings), like PPO's value_head
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS"))
    mark_muon_weights(model)
    trained = {n: p.use_muon for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n, muon in trained.items() if not muon} == {"base_model.model.score.modules_to_save.default.weight"}
    assert sum(trained.values()) == 2 * 2 * 2  # A and B of q and v, two layers


@pytest.mark.parametrize("extra, message", [
    (["--deepspeed", "configs/ds_zero2.json"], r"^--optim muon cannot run under --deepspeed configs/ds_zero2.json: ZeRO "
     r"hands the optimizer flat 1-D slices of the weights"),
    (["--optim_args", "rank=4"], r"^--optim_args rank: --optim muon takes momentum, nesterov, ns_steps, eps, "
     r"adjust_lr_fn"),
    (["--optim_args", "adjust_lr_fn=spectral"], r"^--optim_args adjust_lr_fn=spectral: torch.optim.Muon takes "
     r"match_rms_adamw or original$"),
    (["--optim_args", "ns_steps=five"], r"^--optim_args ns_steps=five: not a int$"),
])
def test_what_cannot_run_is_refused_in_one_line(extra, message):
    with pytest.raises(ConfigError, match=message) as refused:
        parse_run("sft", ["--data_path", "x.jsonl", "--optim", "muon", *extra], check_paths=False)
    assert "\n" not in str(refused.value)


def fsdp_flags(model: str, data: str, out, *extra: str) -> list[str]:
    from tests.system.test_distributed import ROOT

    return flags(model, data, out, "--finetuning_type", "full", "--lr_scheduler_type", "constant", "--max_steps", "3",
                 "--per_device_train_batch_size", "2", "--fsdp_config", str(ROOT / "configs" / "fsdp2.yaml"), *extra)


def logged_losses(out) -> list[float]:
    return [r["loss"] for r in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in r]


@pytest.mark.distributed
def test_fsdp2_runs_it_as_one_process_does(tiny_model_dir, data, tmp_path):
    """Under FSDP2 every weight is a DTensor sharded by rows; torch.optim.Muon's Newton-Schulz steps on it as
    DTensor ops, which gather what each product needs: the same update as one process's, up to the rounding of its
    bfloat16 products (summed in another order; in float32 they agree to 1e-5 of an update)."""
    from tests.system.test_distributed import launch

    launch("sft/train.py", 2, *fsdp_flags(tiny_model_dir, data, tmp_path / "two"))
    one = sft(flags(tiny_model_dir, data, tmp_path / "one", "--finetuning_type", "full", "--lr_scheduler_type",
                    "constant", "--max_steps", "3"))
    assert logged_losses(tmp_path / "two") == pytest.approx([r["loss"] for r in one.state.log_history if "loss" in r],
                                                            rel=2e-3)


@pytest.mark.distributed
@pytest.mark.heavy  # three launches: 8 minutes on this machine under load
def test_fsdp2_resumes_it(tiny_model_dir, data, tmp_path):
    """Saved and resumed through FSDP's optimizer state dict (torch.distributed.checkpoint's, on this optimizer's
    groups): step 3 again, the same step."""
    from tests.system.test_distributed import launch

    two, resumed = tmp_path / "two", tmp_path / "resumed"
    launch("sft/train.py", 2, *fsdp_flags(tiny_model_dir, data, two, "--save_strategy", "steps", "--save_steps", "2"))
    launch("sft/train.py", 2, *fsdp_flags(tiny_model_dir, data, resumed, "--resume_from_checkpoint",
                                          str(two / "checkpoint-2")))
    assert logged_losses(resumed)[-1] == pytest.approx(logged_losses(two)[-1], rel=1e-4)
