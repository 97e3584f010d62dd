"""Drafter training: losses, the loop, checkpoints and distributed set-up."""
