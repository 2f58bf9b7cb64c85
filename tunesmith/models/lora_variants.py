"""PEFT's LoRA variants, set through its own LoraConfig: DoRA, rsLoRA and the initialisations of a new adapter
(--use_dora, --use_rslora, --init_lora_weights). PiSSA and OLoRA start the adapter from the weight's own top
directions and leave the rest, a residual, as the base weight in memory: an adapter saved as trained fits that
residual, not the base it names. So the run keeps the adapter as it was initialised, and the final save is
rewritten by PEFT's own conversion (save_pretrained with path_initial_model_for_weight_conversion) into a plain
LoRA of the unchanged base, of rank 2r: it loads in PEFT, merges, exports and continues like any other adapter.
Checkpoints keep the rank-r adapter with its init in adapter_config.json, which a resume (and PEFT, which splits
the base again when it loads one) reproduces."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import warnings
import weakref
from typing import Any

from ..hparams.finetuning_args import splits_base

logger = logging.getLogger(__name__)

_INITIAL_ADAPTER = "tunesmith_initial_adapter"  # attribute of the PeftModel: the folder of the adapter as initialised


def variant_fields(finetuning_args: Any, has_weights: bool = True) -> dict[str, Any]:
    """LoraConfig's fields for the variant flags; without weights (on the meta device) no PiSSA/OLoRA split."""
    init = finetuning_args.init_lora_weights
    if not has_weights and splits_base(init):
        init = "true"
    elif splits_base(init) and finetuning_args.lora_dropout > 0:
        # measured on the demo (docs/sft.md): the first step's loss 3.56 with dropout 0.05, 2.46 without (base: 2.45)
        logger.warning("--init_lora_weights %s with --lora_dropout %g: the dropout falls on the adapter's input, which "
                       "now carries each weight's principal part, so training starts from a noisier model: use "
                       "--lora_dropout 0", init, finetuning_args.lora_dropout)
    return {"use_dora": finetuning_args.use_dora, "use_rslora": finetuning_args.use_rslora,
            "init_lora_weights": True if init == "true" else init}


def keep_initial_adapter(peft_model: Any) -> None:
    """For PiSSA/OLoRA, the new adapter as initialised, saved to a temporary folder for the final save's
    conversion (save_as_plain_lora); removed with the model. Labelled init true, as PEFT's conversion asks:
    loading it must not split the base a second time."""
    config = peft_model.peft_config[peft_model.active_adapter]
    if not splits_base(str(config.init_lora_weights)):
        return
    folder = tempfile.mkdtemp(prefix="tunesmith-lora-init-")
    path = os.path.join(folder, "initial")
    init, config.init_lora_weights = config.init_lora_weights, True
    try:
        peft_model.save_pretrained(path, selected_adapters=[peft_model.active_adapter])
    finally:
        config.init_lora_weights = init
    setattr(peft_model, _INITIAL_ADAPTER, path)
    weakref.finalize(peft_model, shutil.rmtree, folder, True)
    logger.info("--init_lora_weights %s: the base in memory is the residual; the final adapter is saved as a plain "
                "LoRA of the unchanged base (rank %d)", init, 2 * config.r)


def save_as_plain_lora(peft_model: Any, directory: str) -> bool:
    """Rewrite the adapter that `directory` holds (the final save) as PEFT's conversion of this run's PiSSA/OLoRA
    adapter to a plain LoRA of the unchanged base; False (nothing written) for any other model."""
    from safetensors.torch import load_file, save_file

    initial = getattr(peft_model, _INITIAL_ADAPTER, None)
    if initial is None:
        return False
    weights = os.path.join(directory, "adapter_model.safetensors")
    # PEFT's conversion returns the A and B matrices only. What else the adapter trained is the same in both forms:
    # DoRA's magnitudes (the direction W + s(BA - B0A0) is the residual's W_res + sBA) and modules_to_save (a
    # reward model's score head). Kept as saved, and written back beside the converted matrices.
    kept = {key: tensor for key, tensor in load_file(weights).items() if not _CONVERTED.search(key)}
    with warnings.catch_warnings():
        # PEFT's advice, when the conversion loads the initial adapter beside the trained one, is this conversion
        warnings.filterwarnings("ignore", message=r"(PiSSA|OLoRA) changes the base weights")
        peft_model.save_pretrained(directory, selected_adapters=[peft_model.active_adapter],
                                   path_initial_model_for_weight_conversion=initial)
    if kept:
        save_file({**load_file(weights), **kept}, weights, metadata={"format": "pt"})
    return True


_CONVERTED = re.compile(r"\.lora_[AB]\.")  # the tensors PEFT's conversion rewrites (rank r to 2r)
