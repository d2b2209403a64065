"""Command line entry points: `raygrpo rollout | train | check | reap | export` (`raygrpo.cli.app`)."""

from raygrpo.cli.app import _parser, main

__all__ = ["main"]
