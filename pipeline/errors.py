"""One error hierarchy for gpuwarden, with stable codes.

Modelled on kafka-python's error classes: every error carries a stable ``code`` (what
scripts, logs and tests match on) and a ``retriable`` flag (whether trying the same thing
again may succeed).
"""

from __future__ import annotations

# The command line's exit statuses (documented in the README); a script may match on them.
EXIT_OK = 0
EXIT_FINDINGS = 1  # the command worked and found something: rule errors, failed tests, actions failed
EXIT_USAGE = 2  # the command line is wrong: unknown option, bad option value, unknown scenario
EXIT_INPUT = 3  # a named file or config cannot be read or is not valid
EXIT_UNAVAILABLE = 4  # a broker or service did not answer, or refused the credentials
EXIT_INTERNAL = 70  # a bug: the traceback is shown with -v (sysexits' EX_SOFTWARE)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class GpuwardenError(Exception):
    """Base of every error the project raises on purpose."""

    code = "GW000"
    retriable = False
    exit_code = EXIT_INPUT

    def __init__(self, message: str = "", **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


class UsageError(GpuwardenError):
    """The command line is wrong (an option's value, options that exclude each other)."""

    code = "GW001"
    exit_code = EXIT_USAGE


class InputError(GpuwardenError):
    """A file the user named cannot be read or is not what it should be."""

    code = "GW002"


class ConfigError(GpuwardenError):
    """A configuration value is missing or invalid; the message names the key."""

    code = "GW100"

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config key {key!r}: {message}", key=key)
        self.key, self.reason = key, message


class BusError(GpuwardenError):
    """A message bus operation failed."""

    code = "GW300"
    exit_code = EXIT_UNAVAILABLE


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


class StateKeyError(GpuwardenError):
    """``serve`` has no key to sign and check its checkpoints with (``GPUWARDEN_STATE_KEY``), or
    a key too short to be one, and was not told to run without (``--insecure-state``)."""

    code = "GW401"
