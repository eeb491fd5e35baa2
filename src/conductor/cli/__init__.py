"""Command-line interface: the only composition root (``conductor ...``)."""
