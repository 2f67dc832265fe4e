"""Inference serving: the replica server (micro-batching, hot model swap, prediction records to the
Tracker) and the gateway (least-outstanding balancing, health checks, retry, failover to a backup).

Both run as their own OS processes (`python -m scanflow.serving.replica ...` and
`python -m scanflow.serving.gateway ...`), launched by the platforms (scanflow/platform/local.py, the
Kubernetes manifests) and by `scanflow serve replica|gateway`. Importing this package starts nothing.
"""
