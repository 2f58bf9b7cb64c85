"""The `tunesmith score` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/score.py (`python reward/score.py --help`)."""

from tunesmith.recipes.score import main

if __name__ == "__main__":
    main()
