"""One error hierarchy for gpuwarden, with stable codes.

Modelled on kafka-python's error classes: every error carries a stable ``code`` (what
scripts, logs and tests match on) and a ``retriable`` flag (whether trying the same thing
again may succeed).
"""

from __future__ import annotations


class GpuwardenError(Exception):
    """Base of every error the project raises on purpose."""

    code = "GW000"
    retriable = False

    def __init__(self, message: str = "", **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


class ConfigError(GpuwardenError):
    """A configuration value is missing or invalid; the message names the key."""

    code = "GW100"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config key {key!r}: {message}", key=key)
        self.key = key


class ScenarioError(ConfigError):
    code = "GW101"


class SchemaError(GpuwardenError):
    """A record does not follow the data contract (DESIGN §2)."""

    code = "GW200"


class BusError(GpuwardenError):
    """A message bus operation failed."""

    code = "GW300"


class BrokerUnavailableError(BusError):
    """No broker answered; the same call may succeed later."""

    code = "GW301"
    retriable = True


class DeliveryError(BusError):
    """The broker did not acknowledge a send; retriable when every underlying failure is."""

    code = "GW302"

    def __init__(self, message: str, *, failed: int, retriable: bool) -> None:
        super().__init__(message, failed=failed)
        self.retriable = retriable


class StateError(GpuwardenError):
    """An engine snapshot cannot be restored (wrong version, corrupt)."""

    code = "GW400"
