"""Step 1: /app/notes.txt has the first line."""

from pathlib import Path


def test_outputs():
    """Test that the outputs are correct."""
    assert Path("/app/notes.txt").read_text().splitlines() == ["step one done"]
