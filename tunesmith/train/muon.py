"""`--optim muon`: torch.optim.Muon for the hidden weight matrices, torch.optim.AdamW for everything else, as one
optimizer the Trainer stages, the RL loop, the LR schedulers, accelerate and checkpoints see as any other.

What goes where (`mark_muon_weights`): a 2-D trained weight is Muon's unless it is an embedding (input or output:
nn.Embedding modules, the model's output embeddings, names with `embed` or `lm_head`) or a head on top of the model
(reward's `score`, PPO's `value_head`, PEFT's `modules_to_save` copies); embeddings, heads, norms and biases get
AdamW. LoRA's A and B matrices are 2-D and go to Muon, as in LLaMA-Factory (`_create_muon_optimizer`: every 2-D
parameter but embed/lm_head) and axolotl (its MuonOptimizerFactory: the same, plus modules_to_save to AdamW); the
alternative, AdamW for them, would make `--optim muon` with LoRA plain AdamW. docs/optimizers.md measures both.

One learning rate serves both halves: Muon scales each matrix's update by torch's `adjust_lr_fn="match_rms_adamw"`
(Moonshot's 0.2 * sqrt(max(rows, cols)), "Muon is Scalable for LLM Training"), which gives its update the RMS of an
AdamW update, so --learning_rate, --lora_learning_rate, LoRA+ and the schedulers mean what they mean for AdamW.
`--optim_args adjust_lr_fn=original,momentum=0.95,nesterov=true,ns_steps=5` change torch's Muon settings.

The update itself is torch's: `step` hands each half's param groups to a torch.optim.Muon and a torch.optim.AdamW
that share this optimizer's groups and state, so saving, loading (resume) and param-group edits (the LoRA rate
split, the schedulers) go through torch's own Optimizer code."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..constants import MUON
from ..hparams.optimizers import muon_args

logger = logging.getLogger(__name__)

# The attribute DeepSpeed's Muon tags parameters with (deepspeed.set_optimizer_flags): the same name, the same meaning.
TAG = "use_muon"
HEAD_NAMES = ("embed", "lm_head", "score", "value_head", "modules_to_save")
DEFAULT_ADJUST_LR = "match_rms_adamw"


def mark_muon_weights(model: nn.Module) -> tuple[int, int]:
    """Tag every parameter of `model` with `use_muon` (True for the hidden matrices Muon trains); returns how many
    trained tensors each half got (Muon, AdamW)."""
    embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    output = getattr(model, "get_output_embeddings", lambda: None)()
    if output is not None:
        embeddings |= {id(p) for p in output.parameters()}
    counts = [0, 0]
    for name, p in model.named_parameters():
        hidden = p.ndim == 2 and id(p) not in embeddings and not any(part in name.lower() for part in HEAD_NAMES)
        setattr(p, TAG, hidden)
        if p.requires_grad:
            counts[0 if hidden else 1] += 1
    return counts[0], counts[1]


def uses_muon(p: torch.Tensor) -> bool:
    """Whether Muon trains `p`: its tag, or, untagged, whether it is a matrix."""
    return bool(getattr(p, TAG, p.ndim == 2))


class MuonWithAdamW(torch.optim.Optimizer):
    """Each param group given is split into its Muon half (`"muon": True`) and its AdamW half; a group's own lr and
    weight_decay stay with both halves. `muon_args`: torch.optim.Muon's keyword arguments; the rest: AdamW's."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, muon_args: dict[str, Any] | None = None, **adamw_args: Any) -> None:
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        muon_args = {"adjust_lr_fn": DEFAULT_ADJUST_LR, **(muon_args or {})}
        halves = []
        for group in groups:
            tensors = list(group["params"])
            for muon in (True, False):
                half = [p for p in tensors if uses_muon(p) is muon]
                if half:
                    halves.append({**group, "params": half, MUON: muon})
        super().__init__(halves, {"lr": lr, "weight_decay": weight_decay})
        # torch's two optimizers, built once on this optimizer's groups so that each group holds its optimizer's
        # every setting (torch's defaults filled in); stepped on those groups and this optimizer's state.
        self._inner: dict[bool, torch.optim.Optimizer] = {}
        for muon in (True, False):
            mine = [g for g in self.param_groups if g[MUON] is muon]
            if not mine:
                continue
            if muon:
                inner = torch.optim.Muon(mine, lr=lr, weight_decay=weight_decay, **muon_args)
            else:
                inner = torch.optim.AdamW(mine, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **adamw_args)
            for group, filled in zip(mine, inner.param_groups):
                for key, value in filled.items():
                    group.setdefault(key, value)
            self._inner[muon] = inner
        self.defaults.update({k: v for inner in self._inner.values() for k, v in inner.defaults.items()
                              if k not in self.defaults})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for muon, inner in self._inner.items():
            # the groups as they are now (the LoRA rate split and load_state_dict replace them) and the state
            # as it is now (load_state_dict replaces it)
            inner.param_groups = [g for g in self.param_groups if g[MUON] is muon]
            inner.state = self.state
            if inner.param_groups:
                inner.step()
        return loss


def muon_optimizer(ctx: Any) -> tuple[type, dict[str, Any]]:
    """transformers' optimizer handler for `--optim muon` (its OptimizerContext in, class and kwargs out): the
    Trainer stages call it with the model (tagged here), the RL loop without (rl/command.py tags its model)."""
    if ctx.model is not None:
        muon, adamw = mark_muon_weights(ctx.model)
        logger.info("--optim muon: Muon trains %d matrices, AdamW %d other tensors", muon, adamw)
    return MuonWithAdamW, {**ctx.optimizer_kwargs, **ctx.adam_kwargs, "muon_args": muon_args(ctx.args.optim_args)}


def register() -> None:
    """Make `--optim muon` one of transformers' optimizers: Trainer.get_optimizer_cls_and_kwargs, which the Trainer
    stages and the RL loop both call, looks a name up in this table."""
    from transformers import trainer_optimizer

    trainer_optimizer._OPTIMIZER_HANDLERS.setdefault(MUON, muon_optimizer)
