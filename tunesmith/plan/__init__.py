"""The memory plan (`tunesmith plan`): one SFT step's GPU memory, counted on fake tensors on any machine."""
