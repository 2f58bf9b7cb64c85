"""The `tunesmith chat` command as a script: the recipe, its flags and its examples are in
tunesmith/chat/command.py (`python chat/cli.py --help`)."""

from tunesmith.chat.command import main

if __name__ == "__main__":
    main()
