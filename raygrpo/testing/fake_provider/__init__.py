"""A fake sandbox provider for tests and benchmarks: a local HTTP service with a provider's limits, and the Harbor
backend that talks to it.

Real providers limit how fast sandboxes are created and how many live at once, answer requests beyond either with
HTTP 429, bill for a sandbox until it is deleted or its lifetime ends, and keep running when the client crashes. This
one does the same on 127.0.0.1, in a process of its own, and writes every call to a JSON-lines log, so tests count
limits, 429s and leaks from the provider's side, not from raygrpo's bookkeeping.

- `state.py`: the provider's rules (plain Python): the sliding-window create rate, the live cap, lifetimes, the log.
- `service.py`: the HTTP service (FastAPI) and `FakeProviderProcess`, which runs it as a subprocess.
- `audit.py`: reading the log back: most creates in any 1 s window, most sandboxes alive at once, 429s, leaks.
- `backend.py`: `FakeProviderEnvironment`, a Harbor `BaseEnvironment` whose sandboxes live in the service.

Run it by hand with `python -m raygrpo.testing.fake_provider --create-rate 40 --max-live 400`.
"""
