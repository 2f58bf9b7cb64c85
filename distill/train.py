"""The `tunesmith distill` command as a script: the pipeline, its flags and its examples are in
tunesmith/distill/command.py (`python distill/train.py --help`)."""

from tunesmith.distill.command import main

if __name__ == "__main__":
    main()
