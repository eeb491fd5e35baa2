"""Measurements of conductor itself (figures printed by the CLI and ``bench/``, never asserted)."""
