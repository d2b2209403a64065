"""What a long-lived actor does with the heap it built at start-up: leave it out of garbage collections.

An actor that imports Ray, transformers, torch or Harbor holds a quarter to half a million objects once it is set
up, nearly all of them alive until it exits. The garbage collector's full collections walk every one of them
again, each taking 0.15-0.5 s of the actor's CPU, during which its event loop answers nothing: in an env pool actor
one every few hundred rollouts (`benchmarks/rollout_path.py --no-freeze`), in the embedded ORS server every ~8 s
of a `raygrpo train` run (0.28-0.34 s each). `freeze_heap` moves what exists into the permanent generation once the
actor is set up; what it makes later is collected as usual.
"""

from __future__ import annotations

import gc


def freeze_heap() -> None:
    """Leave every object this process holds now out of later collections (`gc.freeze`), after one collection so
    that no garbage is kept. Call once, when the actor's start-up (imports, tokenizer, server) is done."""
    gc.collect()
    gc.freeze()
