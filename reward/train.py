"""The `tunesmith reward` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/reward.py (`python reward/train.py --help`)."""

from tunesmith.recipes.reward import main

if __name__ == "__main__":
    main()
