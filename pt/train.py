"""The `tunesmith pt` command (continued pre-training on raw text) as a script: the pipeline, its flags and its
examples are in tunesmith/pretrain/command.py (`python pt/train.py --help`)."""

from tunesmith.pretrain.command import main

if __name__ == "__main__":
    main()
