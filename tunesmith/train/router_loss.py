"""A mixture-of-experts model's router load-balancing loss in the SFT objective, counted once per optimizer step.

transformers' MoE causal LMs compute the Switch Transformer load-balancing loss when a forward asks for router
logits (over every token of a packed row, which has no padding; over the attention mask's tokens of a padded
batch) and add `router_aux_loss_coef * aux_loss` to that forward's `loss`. Under the Trainer each forward's
language-model loss is its summed token losses over the whole step's `num_items_in_batch`, so the forwards of a
step add up to the step's mean; the aux loss, already a mean over its forward's tokens, would be added whole by
each: 4 accumulation steps, or a packed row run as 4 forwards (--max_forward_tokens), would weigh it 4 times the
model's coefficient, and `average_tokens_across_devices` (the loss times the number of processes, whose gradients
are then averaged) once more per process. With label smoothing the Trainer does not pass labels, and the model
adds nothing at all.

So the trainer turns the model's own addition off and adds `coefficient * aux_loss * share`, where share is the
forward's routed tokens over the step's routed tokens on this process: a step's forwards add up to the
coefficient times the token-weighted mean of their aux losses, whatever the accumulation, the splits of a packed
row or the number of processes (whose gradients are averaged). That is the whole batch's aux loss when its parts
route alike; exactly it only for one forward, since the loss is a product of two means over the tokens. The
logged `loss` stays the language-model loss (what eval_loss and perplexity measure, comparable with a dense
model's); `aux_loss` is logged beside it, unweighted: about top-k when the experts are evenly loaded, more when
they are not."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..models.moe import causal_lm, router_loss_attribute

logger = logging.getLogger(__name__)

OUTPUT_ROUTER_LOGITS = "output_router_logits"  # the forward's keyword that turns the router logits on


@dataclass
class RouterLoss:
    """The coefficient a run adds the model's aux loss with (0: not added, router logits never computed)."""

    coefficient: float

    @property
    def active(self) -> bool:
        return self.coefficient > 0

    def term(self, outputs: Any, share: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
        """(coefficient * aux_loss * share, aux_loss * share detached) for one forward's outputs."""
        aux = outputs["aux_loss"]
        return self.coefficient * share * aux, (share * aux).detach()


def router_loss_for(model: nn.Module, flag: float | None) -> RouterLoss | None:
    """The router loss of a run on `model` (None for a model that has none), with --router_aux_loss_coef `flag`
    (None: the model's own coefficient). When it is added, the model's own addition is switched off (see the
    module docstring); the choice is logged once."""
    attribute = router_loss_attribute(model)
    name = type(causal_lm(model)).__name__
    if attribute is None:
        if flag:
            logger.warning("--router_aux_loss_coef %g does nothing: %s has no router load-balancing loss", flag, name)
        return None
    base = causal_lm(model)
    own = float(getattr(base, attribute))
    coefficient, source = (own, f"{name}'s {attribute}") if flag is None else (flag, "--router_aux_loss_coef")
    if coefficient == 0:
        logger.info("router load-balancing loss: off (%s is 0)", source)
        return RouterLoss(0.0)
    setattr(base, attribute, 0.0)  # the trainer adds it, once per optimizer step
    logger.info("router load-balancing loss: coefficient %g (%s), added once per optimizer step, logged as aux_loss",
                coefficient, source)
    return RouterLoss(coefficient)


def routed_tokens(batch: dict[str, Any]) -> torch.Tensor | int:
    """How many tokens of a batch the routers' loss counts: the attention mask's where there is one (padding
    excluded, as the model does), else every position (a packed row)."""
    mask = batch.get("attention_mask")
    if mask is not None:
        return mask.sum()
    return batch["input_ids"].numel()
