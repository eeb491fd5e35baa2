"""``conductor demo``: a gateway in front of an emulated 2-prefill + 2-decode cluster."""
