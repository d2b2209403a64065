from pathlib import Path


def test_unique_emails():
    got = Path("/app/unique.txt").read_text().splitlines()
    assert got == [
        "alice@example.com",
        "bob@example.com",
        "carol@example.com",
        "dave@example.com",
    ]
