"""The `tunesmith eval-policy` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/eval_policy.py (`python scripts/eval_policy.py --help`)."""

from tunesmith.recipes.eval_policy import main

if __name__ == "__main__":
    main()
