"""The policy evaluation (`tunesmith eval --policy ...`) as a script: the command, its flags and its examples are in
tunesmith/rl/evaluate_command.py (`python scripts/eval_policy.py --help`)."""

from tunesmith.rl.evaluate_command import main

if __name__ == "__main__":
    main()
