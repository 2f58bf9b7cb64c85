"""`tunesmith eval-rl`: held-out accuracy and format compliance of an RL policy (GRPO's reward functions, e.g.
`--reward_funcs exact_answer answer_format`) against its baseline, with paired standard errors. The same
evaluation as scripts/eval_policy.py; flags and examples in tunesmith/recipes/eval_policy.py."""

from tunesmith.recipes.eval_policy import main

if __name__ == "__main__":
    main()
