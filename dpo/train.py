"""The `tunesmith dpo` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/dpo.py (`python dpo/train.py --help`)."""

from tunesmith.recipes.dpo import main

if __name__ == "__main__":
    main()
