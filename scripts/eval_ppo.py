"""The `tunesmith eval-ppo` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/eval_ppo.py (`python scripts/eval_ppo.py --help`)."""

from tunesmith.recipes.eval_ppo import main

if __name__ == "__main__":
    main()
