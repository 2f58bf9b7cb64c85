"""Supervised fine-tuning (full, LoRA, QLoRA) on multi-turn conversations.

    python sft/train.py --data_path data/demo/sft.jsonl --output_dir outputs/sft
    python sft/train.py configs/sft_lora_demo.yaml --max_steps 10
    torchrun --nproc_per_node 2 sft/train.py --deepspeed configs/ds_zero3.json --data_path data/demo/sft.jsonl

The recipe itself is tunesmith/recipes/sft.py (also installed as `tunesmith-sft`).
"""

from tunesmith.recipes.sft import main

if __name__ == "__main__":
    main()
