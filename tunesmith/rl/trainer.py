"""PPOTrainer: the RL loop on top of accelerate, for PPO, GRPO and RLOO (`--advantage gae|grpo|rloo`).
Each step samples replies to a batch of prompts (rollout), scores them, and runs a few epochs of clipped
policy updates (and, for PPO, value updates) over shuffled mini-batches of that batch. The maths is in
rl/losses/."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from transformers import Trainer, TrainerCallback, get_scheduler
from transformers.trainer_callback import ProgressCallback, TrainerControl, TrainerState

from ..constants import REWARD_PLOT_FILE
from ..data.collator import PaddingCollator
from ..data.prompts import Prompt, left_pad
from ..distributed import zero3_inference_engine, zero_stage
from ..generation.rollout_engines import hand_over_weights, rollout_engine
from ..generation.vllm_client import VLLMRollouts
from ..hparams import check, save_run_config
from ..hparams.rollout_args import RolloutEngineArguments
from ..train.callbacks import plot_loss
from ..train.checkpoints import empty_tensors, read_state
from ..train.ema import WeightAverage
from ..train.lifecycle import (
    SCHEDULER_FILE,
    callback_handler,
    load_optimizer_state,
    load_rng_state,
    load_state,
    load_zero_optimizer_state,  # noqa: F401 (its home was here: tests and callers import it from the RL trainer)
    save_final,
    save_optimizer_state,
    save_rng_state,
    save_state,
    write_checkpoint,
)
from ..train.param_groups import split_lora_groups
from ..utils.io import atomic_write_json
from .args import PPOArguments, ToolUseArguments
from .losses import (
    AdaptiveKLController,
    FixedKLController,
    PolicyLossSpec,
    compute_gae,
    compute_rewards,
    decoupled_group_advantages,
    high_entropy_mask,
    kl_loss,
    leave_one_out_scores,
    logprobs_from_logits,
    masked_mean,
    masked_whiten,
    overlong_penalty,
    policy_loss,
    scaled_group_advantages,
    truncated_importance_weights,
    value_loss,
    varied_groups,
)
from .models import POLICY, VALUE_DIR, ActorCritic
from .reward_sources import RewardFunction, Rewards, load_reward_function
from .rollout import (
    Generated,
    RewardFn,
    RewardModelScorer,
    Rollout,
    Sampled,
    generate_responses,
    pad_replies,
    policy_statistics,
    reply_tokens,
    rollout_sampling,
)
from .rules import RULES
from .tool_rollout import tool_rollout
from .toolbox import Toolbox

logger = logging.getLogger(__name__)

RL_STATE_FILE = "rl_state.json"  # what a checkpoint holds beyond the Trainer's state: the KL coefficient
EMA_DIR = "ema"  # the averaged policy (--ema_decay), inside an output folder


class PPOTrainer:
    """PPO, GRPO or RLOO for a causal LM against a reward model and/or reward functions of the decoded
    replies (reward_funcs, weighted by ppo_args.reward_weights), or one python reward_fn of token ids (for
    tests). With --advantage grpo or rloo the model has no value model (build_actor_critic(...,
    value_model=False)). `train()` runs to max_steps (or num_train_epochs over the prompts), logging every
    logging_steps and checkpointing every save_steps; `resume_from` continues a checkpoint with its
    step, optimizer, scheduler, KL coefficient and random state. With --deepspeed (ZeRO-2 or ZeRO-3)
    the ActorCritic is one DeepSpeed engine; under ZeRO-3 generation is synced across ranks, the
    reward model gets an inference engine of its own, and saves gather the shards first."""

    def __init__(self, model: ActorCritic, tokenizer: Any, prompts: list[Prompt], ppo_args: PPOArguments,
                 training_args: Any, reward_model: RewardModelScorer | None = None,
                 reward_fn: RewardFn | None = None, reward_funcs: Sequence[RewardFunction] | None = None,
                 run_configs: tuple = (), resume_from: str | None = None,
                 lora_learning_rate: float | None = None, ptx_dataset: Any = None,
                 toolbox: Toolbox | None = None, tool_use: ToolUseArguments | None = None,
                 rollout: RolloutEngineArguments | None = None) -> None:
        if reward_funcs is None:  # those ppo_args names (the recipe loads them itself, to fail before any weight loads)
            reward_funcs = [load_reward_function(spec) for spec in ppo_args.reward_funcs]
        if (reward_fn is None) == (reward_model is None and not reward_funcs):
            raise ValueError("PPOTrainer needs a reward_model and/or reward_funcs, or else one reward_fn")
        if not prompts or not prompts[0].input_ids:
            raise ValueError("PPOTrainer needs encoded prompts (tunesmith.data.prompts.encode_prompts)")
        rollout = rollout or RolloutEngineArguments()
        # the rules it needs, also when built without the recipe
        check(ppo=ppo_args, training=training_args, rollout=rollout, feature_rules=RULES)
        if model is not None and model.has_value_model != ppo_args.uses_value_model:
            raise ValueError(f"--advantage {ppo_args.advantage} needs a model built with "
                             f"value_model={ppo_args.uses_value_model}")
        self.args, self.ppo = training_args, ppo_args
        self.tokenizer, self.prompts = tokenizer, prompts
        self.reward_model, self.reward_fn = reward_model, reward_fn
        self.ptx_dataset = ptx_dataset  # PPO-ptx: encoded SFT records (input_ids, labels)
        # Tools in rollouts (--tool_funcs): the prompts must be encoded with them (tool_rollout.encode_tool_prompts).
        self.toolbox, self.tool_use = toolbox, tool_use
        self._ptx_place = 0  # the micro-step (of the whole run) whose PPO-ptx batch comes next
        self.rewards = None if reward_fn else Rewards(tokenizer, reward_funcs, ppo_args.reward_weights, reward_model,
                                                      ppo_args.reward_model_weight)
        self.run_configs = run_configs
        deepspeed_plugin = getattr(training_args, "deepspeed_plugin", None)
        self.accelerator = Accelerator(
            # accelerate ignores a DeepSpeed plugin when told cpu=True (it would run plain DDP); the
            # process group is gloo on CPU either way, set up by TrainingArguments. transformers'
            # Trainer does not pass cpu either.
            cpu=training_args.use_cpu and deepspeed_plugin is None,
            mixed_precision="bf16" if training_args.bf16 else "no",
            gradient_accumulation_steps=training_args.gradient_accumulation_steps,
            deepspeed_plugin=deepspeed_plugin,
        )
        torch.manual_seed(training_args.seed)

        self.batch_size = training_args.per_device_train_batch_size
        self.global_batch = self.batch_size * self.accelerator.num_processes
        self.mini_batch = self.batch_size // ppo_args.num_mini_batches
        self.micro_batch = self.mini_batch // training_args.gradient_accumulation_steps
        self.prompts_per_step = self.global_batch // ppo_args.samples_per_prompt
        if training_args.max_steps > 0:
            self.total_steps = training_args.max_steps
        else:
            self.total_steps = math.ceil(training_args.num_train_epochs * len(prompts) / self.prompts_per_step)

        self.trainable = model.trainable_parameters()
        # The optimizer and schedule the Trainer stages get from the same flags (--optim, --adam_*, --weight_decay,
        # --lr_scheduler_type, --lr_scheduler_kwargs, --warmup_steps), through transformers' own factory.
        optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(training_args)
        groups = [{"params": self.trainable, "weight_decay": training_args.weight_decay}]
        optimizer = optimizer_cls(split_lora_groups(groups, model, training_args.learning_rate, lora_learning_rate),
                                  **optimizer_kwargs)
        updates = self.total_steps * ppo_args.ppo_epochs * ppo_args.num_mini_batches
        # Stepped by hand after each real optimizer step: accelerate's prepared scheduler would step
        # once per process.
        self.scheduler = get_scheduler(training_args.lr_scheduler_type, optimizer,
                                       num_warmup_steps=training_args.get_warmup_steps(updates),
                                       num_training_steps=updates,
                                       scheduler_specific_kwargs=training_args.lr_scheduler_kwargs or None)
        if getattr(training_args, "hf_deepspeed_config", None) is not None:
            fill_deepspeed_config(training_args, model.policy, self.micro_batch, updates, self.accelerator.num_processes)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.ema = WeightAverage(self.unwrapped.policy_weights(), ppo_args.ema_decay) if ppo_args.ema_decay else None
        self.zero_stage = zero_stage(training_args) if self.accelerator.distributed_type == DistributedType.DEEPSPEED else 0
        if reward_model is not None:
            reward_model.model = self._prepare_reward_model(reward_model.model)
        setup = self.accelerator.distributed_type.value + (f" ZeRO-{self.zero_stage}" if self.zero_stage else "")
        logger.info("PPO on %d process(es), distributed type %s", self.accelerator.num_processes, setup)

        self.kl_ctl = (AdaptiveKLController(ppo_args.kl_coef, ppo_args.kl_target, ppo_args.kl_horizon)
                       if ppo_args.adaptive_kl else FixedKLController(ppo_args.kl_coef))
        self.loss_spec = policy_loss_spec(ppo_args)
        self.sampling = rollout_sampling(ppo_args.max_new_tokens, ppo_args.temperature, ppo_args.top_k,
                                         ppo_args.top_p)
        # Under ZeRO-3 every rank must keep stepping until all are done: each forward gathers the sharded
        # weights collectively (tunesmith's engine; a vLLM server holds whole weights of its own).
        self.engine = rollout_engine(rollout, self.unwrapped.policy, tokenizer, training_args.output_dir,
                                     synced=self.zero_stage == 3, dtype=torch.bfloat16 if training_args.bf16 else None)
        self.on_server = isinstance(self.engine, VLLMRollouts)  # a server, or colocated
        self._sampler = ThreadPoolExecutor(1, thread_name_prefix="rollout") if ppo_args.async_rollouts else None
        self._pending: tuple[int, Future] | None = None  # with --async_rollouts: (step, its replies being sampled)
        self.step = 0
        self._server_checked = False
        # The Trainer stages' lifecycle objects and callbacks: the same progress bar with its ETA, metrics.jsonl,
        # --report_to integrations (TensorBoard, wandb, ...) and trainer_state.json format.
        self.state = TrainerState(is_local_process_zero=self.accelerator.is_local_main_process,
                                  is_world_process_zero=self.accelerator.is_main_process)
        self.state.max_steps, self.state.logging_steps = self.total_steps, training_args.logging_steps
        self.state.save_steps = training_args.save_steps
        self.control = TrainerControl()
        console = RolloutLinePrinter() if training_args.disable_tqdm else RolloutProgressCallback()
        self.callbacks = callback_handler(training_args, self.unwrapped, tokenizer, self.optimizer, self.scheduler,
                                          console)
        self._perms: dict[Any, torch.Tensor] = {}  # seeded shuffles: prompts by pass, ("ptx", pass) for PPO-ptx
        if resume_from:
            self._load_state(resume_from)

    def _prepare_reward_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The reward model only runs forward. Under ZeRO-3 from_pretrained has sharded it (transformers
        loads every model inside deepspeed.zero.Init once a ZeRO-3 config exists), and its weights stay
        empty placeholders unless a DeepSpeed engine gathers them during the forward: it gets an
        inference engine of its own (no optimizer), as trl's PPO did. Otherwise every process keeps a
        whole copy."""
        if self.zero_stage != 3:
            return model.to(self.accelerator.device)
        return zero3_inference_engine(model, self.accelerator.deepspeed_config)

    @property
    def unwrapped(self) -> ActorCritic:
        return self.accelerator.unwrap_model(self.model)

    @property
    def kl_coef(self) -> float:
        return self.kl_ctl.value

    @property
    def log_history(self) -> list[dict[str, Any]]:
        return self.state.log_history

    # ------------------------------------------------------------------ loop

    def train(self) -> list[dict[str, Any]]:
        self.control = self.callbacks.on_train_begin(self.args, self.state, self.control)
        while self.step < self.total_steps:
            self.train_step()
        self.control = self.callbacks.on_train_end(self.args, self.state, self.control)
        if self._sampler is not None:  # a batch sampled ahead for a step past the last is not needed
            self._sampler.shutdown(wait=True, cancel_futures=True)
            self._pending = None
        self.save_model(self.args.output_dir)
        if self.accelerator.is_main_process:
            score_keys = tuple(k for k in (self.log_history[-1] if self.log_history else {}) if k.startswith("score"))
            plot_loss(self.log_history, os.path.join(self.args.output_dir, REWARD_PLOT_FILE),
                      keys=tuple(k for k in score_keys if k != "score_std"), ylabel="mean score of the rollout batch")
        return self.log_history

    def train_step(self) -> dict[str, Any]:
        """One PPO step: a rollout batch, its updates, the KL controller, then logging/saving."""
        start = time.perf_counter()
        rollout = self.rollout(self.batch_prompts(self.step))
        mid = time.perf_counter()
        update_stats = self.update(rollout)
        times = {"time_generate": rollout.generate_seconds, "time_score": mid - start - rollout.generate_seconds,
                 "time_train": time.perf_counter() - mid}
        if self.on_server:
            times["time_sync"] = self.engine.sync_seconds

        kl_per_reply = rollout.kl.sum(1)
        mean_kl = self.accelerator.reduce(kl_per_reply.mean(), reduction="mean")
        kl_coef_used = self.kl_ctl.value
        self.kl_ctl.update(mean_kl, n_steps=self.global_batch)
        self.step += 1
        self.state.global_step = self.step
        self.state.epoch = self.step * self.prompts_per_step / len(self.prompts)

        stats = self._rollout_stats(rollout) | update_stats | times
        stats |= {"kl": float(mean_kl), "kl_coef": kl_coef_used, "lr": self.scheduler.get_last_lr()[0]}
        row = {"step": self.step, **{k: round(float(v), 6) for k, v in stats.items()}}
        if self.step % max(1, int(self.args.logging_steps)) == 0 or self.step == self.total_steps:
            self._log(row, rollout)
        self.control = self.callbacks.on_step_end(self.args, self.state, self.control)
        save_steps = int(self.args.save_steps)
        if self.args.save_strategy == "steps" and save_steps > 0 and self.step % save_steps == 0:
            self.save_checkpoint()
            self.control = self.callbacks.on_save(self.args, self.state, self.control)
        return row

    def batch_prompts(self, step: int, sampling_round: int = 0) -> list[Prompt]:
        """This process's prompts for a step: a fresh seeded shuffle for every pass over the data,
        a function of the step alone, so a resumed run sees the same batches. Each prompt appears
        samples_per_prompt times in a row, and every process gets whole groups. Dynamic sampling's later
        rounds (sampling_round >= 1) draw prompts at random, seeded by the step and the round (so a resumed
        run draws them again), without moving the schedule of the steps that follow."""
        picked = []
        if sampling_round:
            gen = torch.Generator().manual_seed(self.args.seed + 1_000_003 * (step + 1) + sampling_round)
            drawn = torch.randint(len(self.prompts), (self.prompts_per_step,), generator=gen)
            picked = [self.prompts[int(i)] for i in drawn for _ in range(self.ppo.samples_per_prompt)]
        for k in range(0 if sampling_round else self.prompts_per_step):
            epoch, position = divmod(step * self.prompts_per_step + k, len(self.prompts))
            if epoch not in self._perms:
                gen = torch.Generator().manual_seed(self.args.seed + epoch)
                self._perms[epoch] = torch.randperm(len(self.prompts), generator=gen)
            picked += [self.prompts[int(self._perms[epoch][position])]] * self.ppo.samples_per_prompt
        rank = self.accelerator.process_index
        return picked[rank * self.batch_size:(rank + 1) * self.batch_size]

    def ptx_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The next PPO-ptx batch of micro_batch rows: consecutive places in seeded shuffles of the data (a new
        shuffle for every pass), each process at its own places, a function of the step and micro-step alone,
        so a resumed run draws what the uninterrupted one would have."""
        micro_step, self._ptx_place = self._ptx_place, self._ptx_place + 1
        first = (micro_step * self.accelerator.num_processes + self.accelerator.process_index) * self.micro_batch
        rows = []
        for place in range(first, first + self.micro_batch):
            epoch, position = divmod(place, len(self.ptx_dataset))
            key = ("ptx", epoch)
            if key not in self._perms:
                self._perms[key] = torch.randperm(len(self.ptx_dataset),
                                                  generator=torch.Generator().manual_seed(self.args.seed + epoch))
            rows.append(self.ptx_dataset[int(self._perms[key][position])])
        batch = PaddingCollator(self.tokenizer.pad_token_id)(rows)
        device = self.accelerator.device
        return batch["input_ids"].to(device), batch["attention_mask"].to(device), batch["labels"].to(device)

    # ------------------------------------------------------------------ rollout

    @torch.no_grad()
    def rollout(self, prompts: list[Prompt]) -> Rollout:
        """Sample and score replies (sample()), then everything the update needs: log-probs under the policy and
        the reference, entropies, values, per-token rewards, advantages and the mask of the tokens that train."""
        device = self.accelerator.device
        model = self.unwrapped
        start = time.perf_counter()
        sampled, sampling_stats = self.sample(prompts)
        query_ids, query_mask = (t.to(device) for t in left_pad([p.input_ids for p in sampled.prompts],
                                                                  self.tokenizer.pad_token_id))
        response_ids, response_mask = pad_replies(sampled.replies, self.tokenizer.pad_token_id, device)
        ended = torch.tensor(sampled.ended, dtype=torch.bool, device=device)
        r = Rollout(query_ids, query_mask, response_ids, response_mask, ended,
                    logprobs=None, ref_logprobs=None, values=None, entropy=None,
                    generate_seconds=time.perf_counter() - start, scores=sampled.scores.to(device),
                    source_scores=sampled.source_scores.to(device), sampling_stats=sampling_stats)
        with self.accelerator.autocast():  # the precision of the update's forward, so an unchanged policy's ratio is 1
            stats = policy_statistics(model, *r.inputs(), r.context_length, response_ids, self.mini_batch)
        r.logprobs, r.ref_logprobs, r.values, r.entropy = (stats.get(k) for k in ("logprobs", "ref_logprobs",
                                                                                   "values", "entropy"))
        # The tokens the policy sampled: a tool's result and the template's wrapping around it are context.
        r.action_mask = pad_replies([[int(m) for m in t] for t in sampled.trained], 0, device)[0]
        if sampled.logprobs is not None:  # sampled by a vLLM server: correct its mismatch with the trainer
            r.rollout_logprobs = pad_replies(sampled.logprobs, float("nan"), device)[0].float()
            r.is_weights, is_stats = truncated_importance_weights(r.logprobs, r.rollout_logprobs, r.action_mask,
                                                                  self.ppo.rollout_is_cap)
            r.sampling_stats |= {k: float(v) for k, v in is_stats.items()}
        r.loss_mask = self.loss_mask(r)
        penalised = r.scores - self.shaping(r)
        group = self.ppo.samples_per_prompt
        if self.ppo.uses_value_model:
            penalised = leave_one_out_scores(penalised, group)
        # With --kl_in_loss the KL is a loss term of the update instead (kl_coef 0 here).
        kl_coef = 0.0 if self.ppo.kl_in_loss else self.kl_ctl.value
        r.rewards, _, r.kl = compute_rewards(penalised, r.logprobs, r.ref_logprobs, r.action_mask, kl_coef,
                                             self.ppo.kl_estimator)
        if not self.ppo.uses_value_model:
            # One advantage per reply, from its whole reward (the score less the KL penalty, when that is in
            # the reward), for each of its tokens.
            advantages = self.sequence_advantages(r.rewards.sum(1), r.source_scores)
            r.advantages = torch.where(r.action_mask.bool(), advantages.unsqueeze(1), 0.0)
            return r
        if self.ppo.whiten_rewards:
            r.rewards = masked_whiten(r.rewards, r.action_mask, shift_mean=False)
        advantages, r.returns = compute_gae(r.values, r.rewards, response_mask, self.ppo.gamma, self.ppo.lam)
        r.advantages = masked_whiten(advantages, r.action_mask)
        return r

    def sample(self, prompts: list[Prompt]) -> tuple[Sampled, dict[str, float]]:
        """The replies to the prompts (with --tool_funcs, whole trajectories), scored, and the sampling's counts.
        With --dynamic_sampling (DAPO), the groups whose scores are all equal are set aside and more prompts are
        sampled (batch_prompts' later rounds) until every process holds a batch of groups that differ, or
        --dynamic_sampling_rounds is reached; a batch still short is filled with groups set aside. Every
        process samples in every round while any process is short: under ZeRO-3 their forwards are collective."""
        first = self._score(prompts, self._first_generation(prompts))
        if not self.ppo.dynamic_sampling:
            return first, self._tool_stats(first)
        group = self.ppo.samples_per_prompt
        wanted = len(prompts) // group
        rounds, varied = [first], [varied_groups(first.scores, group)]
        while (len(rounds) < self.ppo.dynamic_sampling_rounds
               and self._anyone_short(sum(int(v.sum()) for v in varied) < wanted)):
            rounds.append(self._sample_round(self.batch_prompts(self.step, len(rounds))))
            varied.append(varied_groups(rounds[-1].scores, group))
        # Groups that differ first, in the order sampled; then, if the batch is still short, the others.
        order = sorted((not v, k, g) for k, flags in enumerate(varied) for g, v in enumerate(flags.tolist()))
        batch = Sampled.gather([(rounds[k], g * group + i) for _, k, g in order[:wanted] for i in range(group)])
        stats = self._tool_stats(batch) | {"sampling_rounds": float(len(rounds)),
                                           "groups_dropped": float(sum(int((~v).sum()) for v in varied)),
                                           "score_sampled": float(torch.cat([r.scores for r in rounds]).mean())}
        return batch, stats

    def _sample_round(self, prompts: list[Prompt]) -> Sampled:
        self.sync_rollout_weights()
        return self._score(prompts, self._generate(prompts))

    def _first_generation(self, prompts: list[Prompt]) -> Generated:
        """This step's replies: sampled now by the policy as it is, or, with --async_rollouts 1, taken from the
        sampling started a step ago (by the policy before the last update), while the next step's batch starts
        sampling on the server with the weights of now."""
        if self._pending is not None and self._pending[0] == self.step:
            generated = self._pending[1].result()
            self._pending = None
        else:
            self.sync_rollout_weights()
            generated = self._generate(prompts)
        if self._sampler is not None and self.step + 1 < self.total_steps:
            self.sync_rollout_weights()
            self._pending = (self.step + 1, self._sampler.submit(self._generate, self.batch_prompts(self.step + 1)))
        return generated

    def _generate(self, prompts: list[Prompt]) -> Generated:
        """The replies to the prompts (with --tool_funcs, whole trajectories): no scoring, no collective, so with
        --async_rollouts it runs beside the update, in the sampler's thread."""
        if self.toolbox is not None:
            runs = tool_rollout(self.engine, self.tokenizer, prompts, self.sampling, self.toolbox,
                                self.tool_use.max_tool_calls, self.tool_use.max_trajectory_tokens)
            return Generated([t.token_ids for t in runs], [t.trained for t in runs], [t.ended for t in runs],
                             [t.tool_calls for t in runs], [t.failed_calls for t in runs],
                             [t.logprobs for t in runs] if self.on_server else None)
        if self.on_server:  # its replies come with its own log-probabilities
            return Generated.of([c[0] for c in self.engine.generate([p.input_ids for p in prompts], self.sampling)],
                                with_logprobs=True)
        response_ids, response_mask, ended = generate_responses(
            self.engine, [p.input_ids for p in prompts], self.sampling, self.tokenizer.pad_token_id)
        replies = reply_tokens(response_ids, response_mask)
        zeros = [0] * len(replies)
        return Generated(replies, [[True] * len(r) for r in replies], ended.tolist(), zeros, zeros)

    def _score(self, prompts: list[Prompt], generated: Generated) -> Sampled:
        # a trajectory is scored whole, tool results included
        scores, source_scores = self.score(prompts, generated.replies)
        return Sampled(list(prompts), generated.replies, generated.trained, generated.ended, scores.float(),
                       source_scores.float(), generated.tool_calls, generated.failed_calls, generated.logprobs)

    def sync_rollout_weights(self) -> None:
        """Hand the policy's weights to the vLLM server when they changed since it last had them, and at the first
        rollout (the server may hold an earlier run's), checked then against the trainer's (rollout_engines.py).
        Under ZeRO-3 the main process writes them gathered from every rank's shards (a collective)."""
        if not self.on_server or self.engine.version == self.step and self._server_checked:
            return
        weights = self._gathered_weights()  # None but under ZeRO-3
        policy_weights = None if weights is None else {k.removeprefix("policy."): v for k, v in weights.items()
                                                       if k.startswith("policy.")}
        probe = None if self._server_checked else list(self.prompts[0].input_ids)
        hand_over_weights(self.engine, self.accelerator, self.unwrapped.policy, self.step, probe, self._compute_dtype,
                          policy_weights)
        self._server_checked = True

    @property
    def _compute_dtype(self) -> torch.dtype:
        if self.args.bf16:
            return torch.bfloat16
        return next(self.unwrapped.policy.parameters()).dtype


    def _tool_stats(self, sampled: Sampled) -> dict[str, float]:
        """Of the batch that trains (with tools): calls per trajectory, and the share of calls that failed (an error
        or a timeout as the result)."""
        if self.toolbox is None:
            return {}
        calls = sum(sampled.tool_calls)
        return {"tool_calls": calls / len(sampled.tool_calls),
                "tool_failures": sum(sampled.failed_calls) / calls if calls else 0.0}

    def _anyone_short(self, short: bool) -> bool:
        """Whether any process still lacks groups (all processes take part, and all get the same answer)."""
        flag = torch.tensor(float(short), device=self.accelerator.device)
        return bool(self.accelerator.reduce(flag, reduction="sum") > 0)

    def shaping(self, r: Rollout) -> torch.Tensor:
        """What each reply loses beside its score [B]: --missing_eos_penalty for a reply that hit max_new_tokens
        without ending (otherwise the policy may learn to ramble past the point where the reward can judge a
        finished answer), and DAPO's soft overlong punishment (--overlong_buffer)."""
        penalty = self.ppo.missing_eos_penalty * (~r.ended).float()
        if self.ppo.overlong_buffer:
            lengths = r.action_mask.sum(1)
            penalty = penalty - self.ppo.overlong_penalty * overlong_penalty(lengths, self.ppo.max_new_tokens,
                                                                             self.ppo.overlong_buffer)
        return penalty

    def loss_mask(self, r: Rollout) -> torch.Tensor:
        """The reply tokens the policy loss trains [B, R]: the policy's own tokens, less the replies cut at
        max_new_tokens (--mask_truncated_completions), less all but the most uncertain tokens
        (--top_entropy_quantile; the quantile is taken over every process's rollout tokens)."""
        mask = r.action_mask.bool()
        if self.ppo.mask_truncated_completions:
            mask = mask & r.ended.unsqueeze(1)
        if self.ppo.top_entropy_quantile < 1.0:
            acc = self.accelerator
            pool = acc.gather(acc.pad_across_processes(r.entropy[mask].float(), dim=0, pad_index=-1.0))
            mask = high_entropy_mask(r.entropy, mask, self.ppo.top_entropy_quantile, pool=pool[pool >= 0])
        return mask.long()

    def sequence_advantages(self, rewards: torch.Tensor, source_scores: torch.Tensor | None) -> torch.Tensor:
        """One advantage per reply [B] for grpo (--scale_rewards, --multi_objective_aggregation) and rloo, taken
        over the rollout batch of every process (equal sizes, whole groups each), then this process's share."""
        acc = self.accelerator
        everyone = acc.gather(rewards.float())
        group = self.ppo.samples_per_prompt
        if self.ppo.advantage == "rloo":
            advantages = leave_one_out_scores(everyone, group)
        elif self.ppo.multi_objective_aggregation == "normalize_then_sum" and self.rewards is not None:
            # What the reward holds beside the weighted sources (penalties, the KL) counts as one more source.
            sources = source_scores.float()
            rest = rewards.float() - sources @ self.rewards.weights.to(sources)
            columns = acc.gather(torch.cat([sources, rest.unsqueeze(1)], dim=1))
            weights = torch.cat([self.rewards.weights, torch.ones(1)]).to(columns)
            advantages = decoupled_group_advantages(columns, weights, group)
        else:
            advantages = scaled_group_advantages(everyone, group, self.ppo.scale_rewards)
        rank, size = acc.process_index, rewards.numel()
        return advantages[rank * size:(rank + 1) * size]

    def score(self, prompts: list[Prompt], replies: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the reward of each reply [B], each reward source's score [B, sources])."""
        if self.reward_fn is not None:
            scores = self.reward_fn([list(p.input_ids) for p in prompts], replies)
            scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1)
            return scores, scores.unsqueeze(1)
        return self.rewards(prompts, replies)

    # ------------------------------------------------------------------ update

    def update(self, r: Rollout) -> dict[str, float]:
        """ppo_epochs passes over the rollout in shuffled mini-batches, one optimizer step each."""
        sums: dict[str, float] = {}
        count = 0
        self._ptx_place = self.step * self.ppo.ppo_epochs * math.ceil(r.query_ids.size(0) / self.micro_batch)
        for _ in range(self.ppo.ppo_epochs):
            order = torch.randperm(r.query_ids.size(0)).to(r.query_ids.device)
            for mini_rows in order.split(self.mini_batch):
                num_tokens = self.tokens_per_micro_step(r.loss_mask[mini_rows])
                kl_tokens = self.tokens_per_micro_step(r.action_mask[mini_rows]) if self.ppo.kl_in_loss else None
                for micro_rows in mini_rows.split(self.micro_batch):
                    with self.accelerator.accumulate(self.model):
                        stats = self._micro_step(r, micro_rows, num_tokens, kl_tokens)
                    for k, v in stats.items():
                        sums[k] = sums.get(k, 0.0) + v
                    count += 1
        return {k: v / count for k, v in sums.items()}

    def tokens_per_micro_step(self, mini_batch_mask: torch.Tensor) -> torch.Tensor:
        """DAPO's denominator as each micro-step divides by it: the trained tokens of the optimizer step (this
        mini-batch on every process) over (micro-steps x processes), because accumulation and the processes'
        average each divide the summed gradients once more."""
        total = self.accelerator.reduce(mini_batch_mask.sum().float(), reduction="sum")
        return total / (self.args.gradient_accumulation_steps * self.accelerator.num_processes)

    def _micro_step(self, r: Rollout, rows: torch.Tensor, num_tokens: torch.Tensor,
                    kl_tokens: torch.Tensor | None) -> dict[str, float]:
        ptx = self.ptx_batch() if self.ptx_dataset is not None else None
        logits, values, ptx_loss = self.model(*r.inputs(rows), r.context_length, ptx=ptx)
        logprobs = logprobs_from_logits(logits, r.response_ids[rows])
        mask, actions = r.loss_mask[rows], r.action_mask[rows]
        loss, pg_stats = policy_loss(logprobs, r.logprobs[rows], r.advantages[rows], mask, self.loss_spec,
                                     num_tokens, None if r.is_weights is None else r.is_weights[rows])
        stats = {"policy_loss": loss.item()}
        if values is not None:
            vf_loss, vf_stats = value_loss(values, r.values[rows], r.returns[rows], actions, self.ppo.cliprange_value)
            # Policy and value weights are disjoint, so one backward of the sum gives each its own gradient.
            loss = loss + self.ppo.vf_coef * vf_loss
            stats["value_loss"] = vf_loss.item()
            pg_stats |= vf_stats
        if ptx_loss is not None:
            loss = loss + self.ppo.ptx_weight * ptx_loss
            stats["ptx_loss"] = ptx_loss.item()
        if self.ppo.kl_in_loss:
            # Over every token the policy sampled (a truncated reply, or one the entropy filter leaves out of the
            # policy loss, is still held near the reference), averaged as the policy loss is.
            kl_term = kl_loss(logprobs, r.ref_logprobs[rows], actions, self.ppo.kl_estimator, self.ppo.loss_type,
                              kl_tokens, self.ppo.max_new_tokens)
            loss = loss + self.kl_ctl.value * kl_term
            stats["kl_loss"] = kl_term.item()
        self.accelerator.backward(loss)
        if self.accelerator.sync_gradients:
            grad_norm = self.accelerator.clip_grad_norm_(self.trainable, self.args.max_grad_norm)
            if grad_norm is not None:
                stats["grad_norm"] = float(grad_norm)
        self.optimizer.step()
        if self.accelerator.sync_gradients and not self.accelerator.optimizer_step_was_skipped:
            self.scheduler.step()
            if self.ema is not None:
                self.ema.update()
        self.optimizer.zero_grad()
        stats |= {k: float(v) for k, v in pg_stats.items()}
        return stats

    # ------------------------------------------------------------------ logging

    def _rollout_stats(self, r: Rollout) -> dict[str, float]:
        acc = self.accelerator
        scores = acc.gather(r.scores)
        lengths = r.action_mask.sum(1).float()  # the policy's own tokens: a tool's result is not its reply
        stats = {
            "score": scores.mean(),
            "score_std": scores.std() if scores.numel() > 1 else torch.zeros(()),
            "reward": acc.reduce(r.rewards.sum(1).mean(), reduction="mean"),
            "entropy": acc.reduce(masked_mean(r.entropy, r.action_mask), reduction="mean"),
            "reply_length": acc.reduce(lengths.mean(), reduction="mean"),
            "eos_rate": acc.reduce(r.ended.float().mean(), reduction="mean"),
        }
        stats |= {k: acc.reduce(torch.tensor(v, device=lengths.device), reduction="mean")
                  for k, v in r.sampling_stats.items()}
        if r.values is not None:
            stats["value_mean"] = acc.reduce(masked_mean(r.values, r.action_mask), reduction="mean")
        if self.rewards is not None and self.rewards.functions:  # each source's mean score, e.g. the accuracy
            source_means = acc.gather(r.source_scores).mean(0)
            stats |= {f"score/{name}": m for name, m in zip(self.rewards.names, source_means)}
        return stats

    def _log(self, row: dict[str, Any], r: Rollout) -> None:
        """As the Trainer logs: into the state's log_history, then every callback's on_log (the console line,
        metrics.jsonl, the --report_to trackers)."""
        logs = {k: v for k, v in row.items() if k != "step"}
        self.state.log_history.append(row)
        self.control = self.callbacks.on_log(self.args, self.state, self.control, logs=logs)
        if not self.accelerator.is_main_process:
            return
        for i in range(min(self.ppo.rollout_log_samples, r.response_ids.size(0))):
            reply = self.tokenizer.decode(reply_tokens(r.response_ids[i:i + 1], r.response_mask[i:i + 1])[0],
                                          skip_special_tokens=True)
            logger.info("sample (score %.3f): %r", float(r.scores[i]), reply)

    # ------------------------------------------------------------------ saving (train/lifecycle.py)

    def save_model(self, output_dir: str) -> None:
        """The policy adapter (or model), the value adapter and head (PPO only), the tokenizer and the run
        config in output_dir, published as every stage's final save is (train/lifecycle.save_final), then
        trainer_state.json, the mark of a finished save."""
        acc = self.accelerator
        acc.wait_for_everyone()
        weights = self._gathered_weights()

        def write(staging: Path) -> None:
            if acc.is_main_process:
                self._write_weights(staging, weights)

        save_final(output_dir, write, acc, should_save=acc.is_main_process)
        if acc.is_main_process:
            save_state(self.state, output_dir)

    def _gathered_weights(self) -> dict[str, torch.Tensor] | None:
        """Under ZeRO-3 the parameters in memory are shards: the trainable weights gathered whole on
        the main process (a collective: every process must call it; others get None), as
        transformers' Trainer saves adapters. None otherwise: each process holds whole weights."""
        if self.zero_stage != 3:
            return None
        return self.model._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)

    def _write_weights(self, directory: Path, weights: dict[str, torch.Tensor] | None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.unwrapped.save(str(directory), weights)
        empty = empty_tensors(str(directory))
        if self.unwrapped.has_value_model:
            empty += empty_tensors(str(directory / VALUE_DIR))
        if empty:
            raise RuntimeError(f"{directory}: saved {len(empty)} empty tensors ({empty[:3]}...): ZeRO-3 shards were "
                               "not gathered")
        folders = [directory]
        if self.ema is not None:  # the averaged policy, loadable like the policy itself
            policy = self.unwrapped.policy
            self.ema.save_model(policy, str(directory / EMA_DIR),
                                **({"selected_adapters": [POLICY]} if self.unwrapped.is_lora else {}))
            folders.append(directory / EMA_DIR)
        for folder in folders:
            self.tokenizer.save_pretrained(str(folder))
            if self.run_configs:
                save_run_config(str(folder), *self.run_configs)

    def save_checkpoint(self) -> str:
        """output_dir/checkpoint-<step> in the Trainer stages' layout (train/lifecycle.py): weights, optimizer
        (under ZeRO one shard per process), scheduler, random state, the KL coefficient (rl_state.json) and
        trainer_state.json, built in a staging folder and renamed into place."""
        return str(write_checkpoint(self.args.output_dir, self.step, self._write_checkpoint, self.accelerator,
                                    self.args.save_total_limit))

    def _write_checkpoint(self, staging: Path) -> None:
        acc = self.accelerator
        save_optimizer_state(self.optimizer, staging, acc.process_index, self.zero_stage, acc.is_main_process)
        save_rng_state(staging, acc.process_index, acc.num_processes)
        acc.wait_for_everyone()
        weights = self._gathered_weights()
        if acc.is_main_process:
            self._write_weights(staging, weights)
            torch.save(self.scheduler.state_dict(), staging / SCHEDULER_FILE)
            if self.ema is not None:
                self.ema.save_state(str(staging))
            atomic_write_json(staging / RL_STATE_FILE, {"kl_coef": self.kl_ctl.value})
            save_state(self.state, staging)  # last: a checkpoint is complete once it reads

    def _load_state(self, checkpoint: str) -> None:
        ckpt = Path(checkpoint)
        read_state(ckpt)  # a PathError naming the file when it does not read
        saved = load_state(ckpt)
        self.state.log_history, self.state.global_step, self.state.epoch = saved.log_history, saved.global_step, saved.epoch
        self.step = saved.global_step
        self.kl_ctl.value = float(json.loads((ckpt / RL_STATE_FILE).read_text(encoding="utf-8"))["kl_coef"])
        acc = self.accelerator
        load_optimizer_state(self.optimizer, ckpt, acc.process_index, acc.num_processes, self.zero_stage)
        self.scheduler.load_state_dict(torch.load(ckpt / SCHEDULER_FILE))
        if self.ema is not None:
            self.ema.load_state(str(ckpt))
        load_rng_state(ckpt, acc.process_index, acc.num_processes)
        logger.info("restored the optimizer, scheduler, random state and kl_coef (%.4g) of %s", self.kl_ctl.value, ckpt)


def policy_loss_spec(ppo: PPOArguments) -> PolicyLossSpec:
    """The policy loss's constants from the RL stage's flags."""
    return PolicyLossSpec(ppo.loss_type, ppo.cliprange, ppo.epsilon_high, ppo.delta, ppo.importance_sampling_level,
                          ppo.sapo_temperature_pos, ppo.sapo_temperature_neg,
                          (ppo.vespo_k_pos, ppo.vespo_lambda_pos, ppo.vespo_k_neg, ppo.vespo_lambda_neg),
                          ppo.max_new_tokens)


def fill_deepspeed_config(training_args: Any, policy: torch.nn.Module, micro_batch: int, updates: int,
                          num_processes: int) -> None:
    """Fill the "auto" values of the run's DeepSpeed config as transformers' Trainer does, but with
    the batch DeepSpeed actually sees: one backward per micro-batch of a shuffled mini-batch of the
    rollout, not per_device_train_batch_size rows (the rollout batch) as the Trainer would assume."""
    hf_config = training_args.hf_deepspeed_config
    hf_config.trainer_config_finalize(training_args, policy, updates)  # bucket sizes from the hidden size
    config = hf_config.config
    config["train_micro_batch_size_per_gpu"] = micro_batch
    config["train_batch_size"] = micro_batch * training_args.gradient_accumulation_steps * num_processes


def rollout_line(state: TrainerState, logs: dict[str, Any]) -> str:
    """The console line of a logged RL step: scores, KL, entropy, clipping, lengths and where the time went."""
    sources = "".join(f" | {k[6:]} {v:.3f}" for k, v in logs.items() if k.startswith("score/"))
    value = f" | value_loss {logs['value_loss']:.4f}" if "value_loss" in logs else ""
    ptx = f" | ptx_loss {logs['ptx_loss']:.4f}" if "ptx_loss" in logs else ""
    clip = f"clipfrac {logs['clipfrac']:.3f} | " if "clipfrac" in logs else ""  # sapo and vespo do not clip
    tools = (f" | tool calls {logs['tool_calls']:.2f} (failed {logs['tool_failures']:.2f})"
             if "tool_calls" in logs else "")
    # replies a vLLM server sampled: the truncated importance weights that corrected them (rl/losses/off_policy.py)
    weights = (f" | is_ratio {logs['is_ratio_mean']:.3f} (max {logs['is_ratio_max']:.2f}, capped "
               f"{logs['is_capped']:.3f})" if "is_ratio_mean" in logs else "")
    sync = f" sync {logs['time_sync']:.1f}s" if "time_sync" in logs else ""
    return (f"step {state.global_step}/{state.max_steps} | score {logs['score']:.3f} ± {logs['score_std']:.3f}"
            f"{sources} | kl {logs['kl']:.3f} (coef {logs['kl_coef']:.3g}) | entropy {logs['entropy']:.2f} | "
            f"{clip}approx_kl {logs['approx_kl']:.4f}{value}{ptx} | "
            f"reply {logs['reply_length']:.1f} tok (eos {logs['eos_rate']:.2f}){tools}{weights} | "
            f"gen {logs['time_generate']:.1f}s{sync} score {logs['time_score']:.1f}s train {logs['time_train']:.1f}s")


class RolloutProgressCallback(ProgressCallback):
    """transformers' progress bar (steps, elapsed, ETA), printing each logged RL step as its one line instead of
    the dict of its ~25 values."""

    def on_step_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:  # a step taken outside train() (train_step() alone) has no bar
            super().on_step_end(args, state, control, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "score" in logs:
            line = rollout_line(state, logs)
            self.training_bar.write(line) if self.training_bar is not None else print(line, flush=True)


class RolloutLinePrinter(TrainerCallback):
    """With --disable_tqdm: the same line, printed."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "score" in logs:
            print(rollout_line(state, logs), flush=True)
