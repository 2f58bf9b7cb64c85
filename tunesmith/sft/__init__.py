"""Supervised fine-tuning (`tunesmith sft`): multi-turn conversations, only the replies trained, read whole or
streamed (--streaming). Its data, finetuning and training arguments are the core's (continued pre-training,
distillation and the memory plan read them too); the Trainer it runs is the core's (train/stage_trainer.py)."""
