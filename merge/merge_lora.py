"""The `tunesmith merge` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/merge.py (`python merge/merge_lora.py --help`)."""

from tunesmith.recipes.merge import main

if __name__ == "__main__":
    main()
