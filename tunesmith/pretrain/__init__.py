"""Continued pre-training (`tunesmith pt`): raw text, every token trained, cut into --max_seq_length pieces."""
