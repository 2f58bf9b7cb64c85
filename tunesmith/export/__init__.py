"""`tunesmith export`, the whole feature in one folder: its arguments (args.py), its refusals and the facts they read
(rules.py), the GGUF writers (gguf_*.py), the llama.cpp checks, the Ollama Modelfile (ollama.py), the checks every
export passes (checks.py) and the command (command.py). It imports the core only (tests/core/test_layout.py)."""
