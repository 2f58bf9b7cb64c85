"""The `tunesmith merge` command as a script: the pipeline, its flags and its examples are in
tunesmith/merge/command.py (`python merge/merge_lora.py --help`)."""

from tunesmith.merge.command import main

if __name__ == "__main__":
    main()
