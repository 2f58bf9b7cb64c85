"""The `tunesmith sft` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/sft.py (`python sft/train.py --help`)."""

from tunesmith.recipes.sft import main

if __name__ == "__main__":
    main()
