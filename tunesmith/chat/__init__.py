"""Multi-round chat with a trained model: ChatSession (session.py); its command line is recipes/chat.py."""

from .session import ChatSession, Outcome

__all__ = ["ChatSession", "Outcome"]
