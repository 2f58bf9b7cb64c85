"""tunesmith: SFT, reward model, PPO, merge and chat for causal LMs, on current library releases."""

import logging
import warnings

# bitsandbytes warns at import, on CPUs with AVX512-BF16, that it could not fetch an optional 4-bit kernel
# from the Hugging Face Hub through the `kernels` package. tunesmith never downloads at run time and
# bitsandbytes' own CPU kernel is used instead (tests/test_sft_training.py trains QLoRA with it), so
# the warning only alarms. Set before anything imports bitsandbytes.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

# peft 0.21 reads the model's deprecated `is_gradient_checkpointing` on every get_peft_model: a warning
# about peft's own code that users can do nothing about.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
