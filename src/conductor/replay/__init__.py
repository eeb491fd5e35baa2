"""``conductor replay``: an open-loop load generator that replays a trace against any
OpenAI-compatible endpoint (a gateway, an engine, a peer router)."""
