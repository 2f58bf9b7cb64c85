"""Multi-round chat with a trained model: ChatSession (engine.py) and the command line (cli.py)."""

from .engine import ChatSession, GenerationArguments, Outcome

__all__ = ["ChatSession", "GenerationArguments", "Outcome"]
