"""The `tunesmith reward` command as a script: the recipe, its flags and its examples are in
tunesmith/preference/reward.py (`python reward/train.py --help`)."""

from tunesmith.preference.reward import main

if __name__ == "__main__":
    main()
