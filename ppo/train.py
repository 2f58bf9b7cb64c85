"""PPO RLHF: sample replies to prompts, score them with the reward model, and train the policy
(LoRA on the SFT model by default) against a KL penalty to the SFT policy.

    python ppo/train.py configs/ppo_lora_demo.yaml
    python ppo/train.py --adapter_name_or_path outputs/sft_demo --reward_model outputs/rm_demo \
        --data_path data/demo/prompts.jsonl --output_dir outputs/ppo_demo --max_steps 30
    python scripts/eval_ppo.py --sft outputs/sft_demo --ppo outputs/ppo_demo --reward_model outputs/rm_demo

The recipe itself is tunesmith/recipes/ppo.py (also installed as `tunesmith-ppo`).
"""

from tunesmith.recipes.ppo import main

if __name__ == "__main__":
    main()
