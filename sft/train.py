"""The `tunesmith sft` command as a script: the recipe, its flags and its examples are in
tunesmith/sft/command.py (`python sft/train.py --help`)."""

from tunesmith.sft.command import main

if __name__ == "__main__":
    main()
