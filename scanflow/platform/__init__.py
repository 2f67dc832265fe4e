"""Where things run. `Platform` is the only interface that knows it; see base.py."""

from scanflow.platform.base import (
    JobResult,
    Platform,
    PlatformError,
    ReplicaStatus,
    ResourceChange,
    ServiceStatus,
)

__all__ = ["JobResult", "Platform", "PlatformError", "ReplicaStatus", "ResourceChange", "ServiceStatus"]
