"""Reward model (full, LoRA, QLoRA) on preference pairs: the chosen reply should outscore the rejected one.

    python reward/train.py configs/reward_lora_demo.yaml
    python reward/train.py --data_path data/demo/preference.jsonl --eval_data_path data/demo/preference_eval.jsonl \
        --output_dir outputs/rm
    python reward/score.py --model_name_or_path outputs/rm --data_path data/demo/preference_eval.jsonl \
        --output_jsonl outputs/rm/scores.jsonl

The recipe itself is tunesmith/recipes/reward.py (also installed as `tunesmith-reward`).
"""

from tunesmith.recipes.reward import main

if __name__ == "__main__":
    main()
