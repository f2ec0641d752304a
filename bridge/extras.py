"""Optional dependencies: the pip extra that brings each, and the one-line error when one is missing.

The base install (``pip install hpc-bridge``) is what a login node needs: Slurm, Flux over its command, local
runs and conversion. A feature whose library comes with an extra imports it through :func:`require` (or catches
the ImportError and raises :class:`MissingExtra` itself), so that its absence reads as the pip command to run.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from bridge.errors import BridgeError

#: the package's name on PyPI, as the pip command spells it
DISTRIBUTION = "hpc-bridge"

#: extra → the top-level modules it brings (``[project.optional-dependencies]`` in pyproject.toml)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "kubernetes": ("kubernetes",),
    "operator": ("kubernetes", "kopf"),
    "staging": ("boto3", "huggingface_hub"),
    "flux": ("flux", "ply"),
    "examples": ("mpi4py",),
}


def install_command(extra: str) -> str:
    """The pip command that installs *extra*, quoted for a shell (the brackets are a glob otherwise)."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class MissingExtra(BridgeError):
    """A feature's optional library is not installed. Installing the extra is the fix, so it is never retried;
    exit 2, like every error that is the user's to fix before running the command again."""

    exit_code = 2

    def __init__(self, extra: str, needed_by: str, *, where: str = "", then: str = "") -> None:
        """*needed_by* is the feature, *where* the machine it runs on when that is not this one, *then* what
        follows the pip command (a version to pick, another way)."""
        if extra not in EXTRA_MODULES:
            raise ValueError(f"no extra {extra!r} (known: {', '.join(EXTRA_MODULES)})")
        self.extra = extra
        self.needed_by = needed_by
        text = f"{needed_by} needs the {extra} extra{f' {where}' if where else ''}: {install_command(extra)}"
        super().__init__(f"{text} {then}" if then else text)


def require(module: str, extra: str, needed_by: str) -> ModuleType:
    """Import *module*, which *extra* brings, for *needed_by* ("the Kubernetes backend"): the module, or
    MissingExtra. Any ImportError counts, a library of the extra that is installed but broken or too old
    included: installing the extra again is the fix either way."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(extra, needed_by) from None
