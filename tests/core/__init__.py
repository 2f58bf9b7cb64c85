"""The core, one folder per layer (tunesmith/utils, families, data, models, train, generation), and test_layout.py."""
