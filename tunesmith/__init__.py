"""tunesmith: SFT, reward model, PPO, merge and chat for causal LMs, on current library releases."""

import importlib.metadata
import logging
import warnings

# The version is setup.cfg's, read from the installed package's metadata, so it is written in one place
# (scripts/setup.sh re-installs whenever setup.cfg changes, which keeps the metadata current).
try:
    __version__ = importlib.metadata.version("tunesmith")
except importlib.metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "unknown"

# bitsandbytes warns at import, on CPUs with AVX512-BF16, that it could not fetch an optional 4-bit kernel
# from the Hugging Face Hub through the `kernels` package. tunesmith never downloads at run time and
# bitsandbytes' own CPU kernel is used instead (tests/features/sft/test_sft_training.py trains QLoRA with it), so
# the warning only alarms. Set before anything imports bitsandbytes.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

# peft 0.21 reads the model's deprecated `is_gradient_checkpointing` on every get_peft_model: a warning
# about peft's own code that users can do nothing about.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)


class _DropCpuAcceleratorNotice(logging.Filter):
    """DeepSpeed prints "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable
    to detect it." to stdout whenever it is imported on a machine without a GPU, which transformers does
    on every save: on a CPU run that is expected, and in chat it would land among the answers. Any other
    DeepSpeed message is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Setting accelerator to CPU")


# The logger DeepSpeed will log through (deepspeed.utils.logging creates "DeepSpeed" with getLogger, so it
# keeps this filter); set before anything imports deepspeed.
logging.getLogger("DeepSpeed").addFilter(_DropCpuAcceleratorNotice())
