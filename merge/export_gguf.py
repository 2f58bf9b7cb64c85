"""The `tunesmith export` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/export.py (`python merge/export_gguf.py --help`)."""

from tunesmith.recipes.export import main

if __name__ == "__main__":
    main()
