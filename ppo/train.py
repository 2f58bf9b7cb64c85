"""The `tunesmith ppo` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/ppo.py (`python ppo/train.py --help`)."""

from tunesmith.recipes.ppo import main

if __name__ == "__main__":
    main()
