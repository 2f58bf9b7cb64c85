"""The `tunesmith chat` command as a script: the recipe, its flags and its examples are in
tunesmith/recipes/chat.py (`python chat/cli.py --help`)."""

from tunesmith.recipes.chat import main

if __name__ == "__main__":
    main()
