"""The typed error hierarchy every layer raises.

Callers decide what to do from the type alone: ``InvalidSpec`` is the user's to fix (exit 2, never
retried), ``BackendUnavailable`` is transient (retry with backoff), ``BackendRejected`` is the
backend's permanent "no" and carries its message.
"""

from __future__ import annotations

from collections.abc import Iterable


class BridgeError(Exception):
    """Base of every error hpc-bridge raises on purpose."""

    #: whether retrying the same call later may succeed
    retryable: bool = False
    #: process exit code the CLI uses for this error
    exit_code: int = 1


class InvalidSpec(BridgeError):
    """Bad input: names the field path and the offending value in one line."""

    exit_code = 2

    def __init__(self, field: str, value: object, problem: str, *, source: str | None = None) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        self.source = source
        where = ": ".join(part for part in (source, field) if part)
        text = f"{problem} (got {_short_repr(value)})"
        super().__init__(_one_line(f"{where}: {text}" if where else text))


class BackendUnavailable(BridgeError):
    """The backend could not be reached or answered with a transient failure."""

    retryable = True

    def __init__(self, backend: str, message: str) -> None:
        self.backend = backend
        super().__init__(_one_line(f"{backend} unavailable: {message}"))


class BackendRejected(BridgeError):
    """The backend understood the request and refused it; retrying will not help."""

    def __init__(self, backend: str, message: str) -> None:
        self.backend = backend
        self.backend_message = message
        super().__init__(_one_line(f"{backend} rejected the request: {message}"))


class Unsupported(BackendRejected):
    """The backend cannot do this at all (not: refused this once). Permanent."""

    def __init__(self, backend: str, message: str) -> None:
        BridgeError.__init__(self, _one_line(f"{backend} cannot do this: {message}"))
        self.backend = backend
        self.backend_message = message


class AlreadyRan(BridgeError):
    """The TrainJob (same uid) already has a finished job on the cluster; running it again is a choice."""

    exit_code = 2

    def __init__(self, message: str, job_id: str, state: str) -> None:
        self.job_id = job_id
        self.state = state
        super().__init__(_one_line(message))


class JobGone(BridgeError):
    """The TrainJob's job was sent before (its status says so), but neither the backend nor this machine's
    record knows it any more: its outcome is lost. Sending it again would run it twice, so nothing is sent."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))


def closest(word: str, known: Iterable[str]) -> str | None:
    """The one of *known* closest to a mistyped *word*; None when none is close (a suggestion that is not near
    what was typed would mislead)."""
    import difflib

    close = difflib.get_close_matches(word, sorted(set(known)), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``did you mean 'numNodes'?`` for the closest of *known* to *word* (``closest``); empty when none is."""
    close = closest(word, known)
    return f"did you mean {close!r}?" if close else ""


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def _short_repr(value: object, limit: int = 80) -> str:
    """repr() cut to one line: error messages must stay a single line whatever the input."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str() (a YAML !!int of thousands of digits)
        text = f"<a {value.bit_length()}-bit number>" if isinstance(value, int) else f"<{type(value).__name__}>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
