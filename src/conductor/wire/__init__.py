"""Engine wire formats, decode and encode (vLLM's KV-cache events today).

Pure translation between bytes and typed values: no sockets, no clocks. This package imports
only :mod:`conductor.core` and third-party codecs; the gateway (which decodes) and the
emulator (which encodes) both import it, never the other way round.
"""
