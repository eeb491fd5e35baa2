"""conductor: a KVCache-centric global scheduler for P/D-disaggregated LLM serving.

The package has one pure core (:mod:`conductor.core`) and three shells around it:
the trace-driven simulator (:mod:`conductor.sim`), the serving gateway
(:mod:`conductor.gateway`) and an emulated engine (:mod:`conductor.emulator`).
"""

__version__ = "0.1.0"
