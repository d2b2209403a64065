from pathlib import Path


def test_report():
    out = Path("/app/errors_by_path.txt")
    assert out.exists(), "missing /app/errors_by_path.txt"
    lines = [l.strip() for l in out.read_text().splitlines() if l.strip()]
    assert lines == ["3 /api/orders", "2 /api/cart", "2 /api/users"]


def test_log_untouched():
    assert len(Path("/srv/data/access.log").read_text().splitlines()) == 12
