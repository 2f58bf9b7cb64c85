"""End to end and several processes: two-rank runs under the launchers, the real default model, the GPU runs."""
