"""conductor: a KVCache-centric global scheduler for P/D-disaggregated LLM serving.

The package has one pure core (:mod:`conductor.core`) and three shells around it:
the trace-driven simulator (:mod:`conductor.sim`), the serving gateway
(:mod:`conductor.gateway`) and an emulated engine (:mod:`conductor.emulator`).
"""

__version__ = "0.1.0"

from conductor import native as _native

NATIVE_MODE = _native.guard()
"""Whether the compiled (mypyc) build of the hot modules is in use: ``"pure"`` (none built),
``"compiled"``, ``"stale"`` (built from other sources: running the sources) or
``"forced-pure"`` (``CONDUCTOR_PURE=1``). See :mod:`conductor.native`."""
