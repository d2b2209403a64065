import importlib.util

spec = importlib.util.spec_from_file_location("stats", "/app/stats.py")
stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stats)


def test_odd():
    assert stats.median([5, 1, 3]) == 3


def test_even():
    assert stats.median([4, 1, 3, 2]) == 2.5
    assert stats.median([10, 20]) == 15


def test_does_not_mutate():
    data = [3, 1, 2]
    stats.median(data)
    assert data == [3, 1, 2]


def test_mean_unchanged():
    assert stats.mean([1, 2, 3, 4]) == 2.5
