"""pdraft: parallel-draft speculative decoding, from a target model to a trained, calibrated DFlash or
DSpark drafter, with one recipe format and one runtime for every command."""

__version__ = "0.1.0"
