"""The preference feature: training on preferred and rejected replies, and scoring with what it trains.
`tunesmith dpo` (command.py: DPO, IPO, SimPO, ORPO, and KTO on single judged replies), `tunesmith reward` (reward.py:
a reward model, a score head trained on pairs) and `tunesmith score` (score.py: a reward model's scores of a file).

args: their dataclasses; rules: their refusals and the facts they read; dpo_loss: the losses, pure tensors, each
checked against a hand calculation; pair_trainer: what the Trainers on pairs share (per-pair evaluation);
dpo_trainer, kto_trainer, reward_trainer: the Trainers. The pairs and judged replies are read by the core's data/
(preference.py, unpaired.py), which PPO's reward model and the policy evaluation read too. It imports the core only
(tests/core/test_layout.py); nothing is imported here, so that parsing a command's flags loads no Trainer."""
