"""Drafter models (DFlash, DSpark). Placeholder package so `pdraft.models.api` imports; the drafter-models
branch owns this folder and replaces this file at merge."""
