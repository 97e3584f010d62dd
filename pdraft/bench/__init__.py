"""Benchmarking and metrics: `metrics` is the single definition of every decoding metric pdraft reports."""
