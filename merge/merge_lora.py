"""Merge a LoRA adapter (SFT or reward model, LoRA or QLoRA) into an unquantized copy of its base.

    python merge/merge_lora.py --adapter outputs/sft --output_dir outputs/sft-merged
    python merge/merge_lora.py --adapter DIR --base_model M --output_dir OUT --dtype bfloat16 [--overwrite]

Writes safetensors shards, tokenizer, chat template and generation config, then checks the merged
model's logits against base + adapter. The recipe is tunesmith/recipes/merge.py (`tunesmith-merge`).
"""

from tunesmith.recipes.merge import main

if __name__ == "__main__":
    main()
