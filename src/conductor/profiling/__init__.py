"""``conductor profile``: time a live OpenAI-compatible engine and fit a cost model."""
