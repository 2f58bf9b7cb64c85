"""The first name of scripts/eval_policy.py (`--sft`/`--ppo` are the old spellings of `--baseline`/`--policy`)."""

from tunesmith.recipes.eval_policy import main

if __name__ == "__main__":
    main()
