"""The `tunesmith serve` command as a script: the recipe, its flags and its examples are in
tunesmith/serve/command.py (`python chat/serve.py --help`)."""

from tunesmith.serve.command import main

if __name__ == "__main__":
    main()
