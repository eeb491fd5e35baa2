"""The load generator and harness behind ``bench/gateway_load.py``, one module per job
(running that script puts bench/ on ``sys.path``, so this package imports as ``loadgen``)."""
