"""The `tunesmith serve` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/serve.py (`python chat/serve.py --help`)."""

from tunesmith.recipes.serve import main

if __name__ == "__main__":
    main()
