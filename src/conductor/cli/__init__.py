"""Command-line shells: the composition root (``conductor ...``)."""
