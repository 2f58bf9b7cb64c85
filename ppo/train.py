"""The `tunesmith ppo` command as a script: the recipe, its flags and its examples are in
tunesmith/rl/command.py (`python ppo/train.py --help`)."""

from tunesmith.rl.command import main

if __name__ == "__main__":
    main()
