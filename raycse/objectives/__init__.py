"""Objectives: one file per method over the shared contrastive core (``contrastive.py``)."""

from raycse.objectives.registry import build, build_params, get, knobs, names

__all__ = ["build", "build_params", "get", "knobs", "names"]
