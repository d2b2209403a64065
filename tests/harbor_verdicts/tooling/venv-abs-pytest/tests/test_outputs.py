from pathlib import Path


def test_top_file_exists():
    assert Path("/app/top.txt").is_file()


def test_top_name():
    assert Path("/app/top.txt").read_text().strip() == "bo"
