"""tunesmith's benchmarks: each module measures one thing against a peer and prints a table, run from the repository
root as `.venv/bin/python -m benchmarks.<name> [flags]` (its docstring has the command and what it measures).

    common            what they share: the repository root, the offline environment, the step clock, the driver that
                      runs each variant in its own `python -m benchmarks.<name> --worker V` process once the cores
                      are idle, medians and spreads
    sft, dpo, rl      a training stage's throughput and memory against TRL's trainer (and a plain loop, PPO)
    moe               transformers' experts kernels against each other and TRL, on mixture-of-experts shapes
    context           the longest trainable context, and the speed of fixed lengths
    attention         one layer's packed attention kernels alone
    serve             the server's requests/s and latency against `transformers serve`
    served_eval       lm-eval through the server against lm-eval in process
    row_bound         what one huge data row costs the data step
    gguf_quality      size, perplexity and greedy agreement of GGUF files in llama.cpp
    qat_compare       quantization-aware training against quantizing afterwards
    muon_sweep        Muon against AdamW, each at its best learning rate
    optimizer_memory  optimizer-state bytes per trained parameter, per --optim

Not installed with tunesmith (setup.cfg packages tunesmith* only): the package is found from the repository root, and
pytest puts that root on sys.path (pyproject.toml's pythonpath) for tests/benchmarks/.
"""
