"""The `tunesmith export` command as a script: the pipeline, its flags and its examples are in
tunesmith/export/command.py (`python merge/export_gguf.py --help`)."""

from tunesmith.export.command import main

if __name__ == "__main__":
    main()
