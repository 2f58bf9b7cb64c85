"""`tunesmith merge`, the whole feature in one folder: its arguments (args.py), its refusals and the facts they read
(rules.py), mergekit's multi-model merges (methods.py) and the command (command.py: a LoRA adapter merged into its
base and checked against base + adapter, or several models merged by --method). Loading an adapter on its base and
merging it in memory is the core's (models/merging.py), which export shares. It imports the core only
(tests/core/test_layout.py)."""
