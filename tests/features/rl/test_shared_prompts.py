"""GRPO's forwards run each distinct prompt once (rl/shared_prompts.py): the same logits and gradients as
one forward over every prompt + reply row, for fewer tokens."""

from __future__ import annotations

import pytest
import torch

from tunesmith.data.prompts import left_pad
from tunesmith.hparams import FinetuningArguments, ModelArguments, TrainingArguments
from tunesmith.models.loader import load_model
from tunesmith.rl.models import response_logits
from tunesmith.rl.rollout import sequence_inputs
from tunesmith.rl.shared_prompts import prompt_groups


@pytest.fixture(scope="module")
def policy(tiny_model_dir, tmp_path_factory):
    model = load_model(ModelArguments(model_name_or_path=tiny_model_dir, dtype="float32"),
                       FinetuningArguments(lora_r=4, lora_alpha=8),
                       TrainingArguments(output_dir=str(tmp_path_factory.mktemp("out")), bf16=False))
    model.eval()
    torch.manual_seed(0)
    for module in model.modules():  # a LoRA that changes the model, so its gradients flow through the prompt
        if hasattr(module, "lora_B"):
            for layer in module.lora_B.values():
                torch.nn.init.normal_(layer.weight, std=0.02)
    return model


def rows_of(prompt_rows: list[int], reply_length: int, seed: int = 0):
    """Two prompts of different lengths (so one is left-padded), replies of which two end early."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, 400, (n,), generator=gen).tolist() for n in (7, 4)]
    query, query_mask = left_pad([prompts[i] for i in prompt_rows], 0)
    replies = torch.randint(5, 400, (len(prompt_rows), reply_length), generator=gen)
    reply_mask = torch.ones_like(replies)
    reply_mask[1, reply_length // 2:] = 0
    reply_mask[-1, 1:] = 0
    replies[reply_mask == 0] = 0
    return (*sequence_inputs(query, query_mask, replies, reply_mask), query.size(1), replies, reply_mask.bool())


def one_forward(model, input_ids, attention_mask, position_ids, context_length):
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                logits_to_keep=input_ids.size(1) - context_length + 1, use_cache=False)
    return out.logits[:, :-1]


def reply_logprob(logits, replies, mask):
    return torch.log_softmax(logits, -1).gather(-1, replies[..., None])[..., 0][mask].sum()


@pytest.mark.parametrize("reply_length", [1, 5])
def test_each_prompt_runs_once_and_the_logits_are_the_one_forwards(policy, reply_length):
    ids, mask, positions, context, replies, reply_mask = rows_of([0, 1, 0, 0, 1, 1], reply_length)
    tokens = []
    hook = policy.get_input_embeddings().register_forward_pre_hook(lambda m, args: tokens.append(args[0].numel()))
    try:
        with torch.no_grad():
            shared = response_logits(policy, ids, mask, positions, context)
    finally:
        hook.remove()
    # two prompts (of `context` positions, left-padded), then the six replies but their last token
    assert tokens == [2 * context] + ([6 * (reply_length - 1)] if reply_length > 1 else [])
    with torch.no_grad():
        expected = one_forward(policy, ids, mask, positions, context)
    assert shared.shape == expected.shape
    torch.testing.assert_close(shared[reply_mask], expected[reply_mask], rtol=0, atol=1e-5)


def test_gradients_sum_over_the_replies_into_the_shared_prompt(policy):
    ids, mask, positions, context, replies, reply_mask = rows_of([1, 0, 1, 0, 0, 1, 1, 0], 4, seed=1)
    params = [p for p in policy.parameters() if p.requires_grad]
    shared = torch.autograd.grad(reply_logprob(response_logits(policy, ids, mask, positions, context), replies,
                                               reply_mask), params)
    expected = torch.autograd.grad(reply_logprob(one_forward(policy, ids, mask, positions, context), replies,
                                                 reply_mask), params)
    for got, want in zip(shared, expected):  # float32 summed in another order: 1e-4 of each tensor's scale
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    assert max(float(g.abs().max()) for g in shared) > 0


def test_rows_with_a_prompt_each_keep_the_one_forward():
    prompts = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [3, 2, 1]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    assert prompt_groups(prompts, prompt_mask) is None  # 3 prompts for 4 rows: under 2 rows a prompt
    # the same ids behind a different padding mask are another prompt
    firsts, group = prompt_groups(prompts[[0, 2, 0, 2]], torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]))
    assert len(firsts) == 2 and group[0] == group[1] != group[2] == group[3]
    assert group[firsts].tolist() == sorted(set(group.tolist()))
