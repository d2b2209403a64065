"""Step 2: /app/notes.txt has both lines."""

from pathlib import Path


def test_outputs():
    """Test that the outputs are correct."""
    assert Path("/app/notes.txt").read_text().splitlines() == ["step one done", "step two done"]
