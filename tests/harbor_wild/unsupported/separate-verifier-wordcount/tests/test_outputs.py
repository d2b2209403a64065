"""The separate verifier only sees what the agent left in /app (collected as an artifact)."""

from pathlib import Path


def test_outputs():
    """Test that the outputs are correct."""
    assert Path("/app/count.txt").read_text().strip() == "9"
