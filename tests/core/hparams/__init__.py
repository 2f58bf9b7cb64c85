"""The hparams layer: the rules kit."""
