"""The Trainer base, checkpoints, losses, memory. Importing this package registers `--optim muon` with transformers'
optimizer factory (train/muon.py), which every training loop (the Trainer stages and the RL loop) builds from."""

from .muon import register

register()
