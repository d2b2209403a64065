"""The task folders here are fixtures, not raygrpo tests: their tests/test_outputs.py files run inside
task containers (they read /app, /srv, ...), so pytest must never collect them from the repository."""

collect_ignore_glob = ["tasks/*", "unsupported/*", "multi_step/*"]
