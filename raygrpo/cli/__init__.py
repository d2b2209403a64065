"""Command line entry points: `raygrpo rollout | train | check | reap | export` (`raygrpo.cli.app`)."""

from raygrpo.cli.app import main

__all__ = ["main"]
