"""Commands on this machine as another Unix user: the operator acting for a tenant on a local Slurm client.

The one mechanism is ``sudo -n -u USER -- COMMAND``, allowed by a fixed sudoers rule the site installs (the
Slurm commands only, to the tenants' users only, keeping SLURM_CONF; see docs/tenancy.md). sudo is never asked
for a password (``-n``): a machine without the rule refuses at once, with sudo's own reason, and nothing runs as
the operator's own user instead.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator, Mapping, Sequence

from bridge.adapters.transport import CommandResult, Transport
from bridge.errors import BackendRejected

SUDO = ("sudo", "-n", "-u")


def current_user() -> str:
    """The Unix user this process runs as (by uid: $USER can say anything)."""
    return pwd.getpwuid(os.geteuid()).pw_name


class RunAs(Transport):
    """*inner*'s commands, each run as *user* through sudo."""

    def __init__(self, inner: Transport, user: str) -> None:
        self.inner, self.user = inner, user
        self.name = inner.name

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return [*SUDO, self.user, "--", *argv]

    def run(self, argv: Sequence[str], stdin: str | None = None, timeout: float = 60.0,
            resend: bool = True, job_env: Mapping[str, str] | None = None) -> CommandResult:
        # a job's environment travels on fd 3 into sbatch (the sudoers rule keeps that descriptor open)
        result = self.inner.run(self._argv(argv), stdin=stdin, timeout=timeout, resend=resend, job_env=job_env)
        _check_sudo(result.returncode, result.stderr, self.user, argv[0])
        # callers read the command they asked for, not sudo's wrapping
        return CommandResult(tuple(argv), result.returncode, result.stdout, result.stderr)

    def stream(self, argv: Sequence[str], timeout: float = 24 * 3600.0, check: bool = True) -> Iterator[str]:
        return self.inner.stream(self._argv(argv), timeout=timeout, check=check)

    def close(self) -> None:
        self.inner.close()


def _check_sudo(code: int, stderr: str, user: str, command: str) -> None:
    if code != 0 and stderr.lstrip().startswith("sudo:"):
        reason = " ".join(stderr.split())[:300]
        raise BackendRejected("sudo", f"running {command} as {user} was refused ({reason}); the operator acts for "
                                      "a tenant only through the sudoers rule in docs/tenancy.md")
