"""Multi-round chat with a trained model: ChatSession (engine.py); its command line is recipes/chat.py."""

from .engine import ChatSession, Outcome

__all__ = ["ChatSession", "Outcome"]
