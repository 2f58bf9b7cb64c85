"""The `tunesmith dpo` command as a script: the recipe, its flags and its examples are in
tunesmith/preference/command.py (`python dpo/train.py --help`)."""

from tunesmith.preference.command import main

if __name__ == "__main__":
    main()
