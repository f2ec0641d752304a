"""Hostfiles in the two formats MPI launchers read.

Open MPI wants ``host slots=N``; MPICH/Intel Hydra wants ``host:N`` and rejects ``slots=``
("token slots not supported at this time").
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence

# named tuples, not dataclasses, in bridge.mpi: every node of every job imports these at start-up, and the
# dataclasses module alone costs ~10 ms there


class Peer(namedtuple("Peer", "host slots")):
    """A host and its slots (MPI ranks)."""

    __slots__ = ()


def merge_duplicates(peers: Sequence[Peer]) -> list[Peer]:
    """One line per host with the slots added up, in first-seen order (the local cluster repeats localhost)."""
    totals: dict[str, int] = {}
    for peer in peers:
        totals[peer.host] = totals.get(peer.host, 0) + peer.slots
    return [Peer(host, slots) for host, slots in totals.items()]


def openmpi_hostfile(peers: Sequence[Peer]) -> str:
    return "".join(f"{peer.host} slots={peer.slots}\n" for peer in merge_duplicates(peers))


def hydra_hostfile(peers: Sequence[Peer]) -> str:
    return "".join(f"{peer.host}:{peer.slots}\n" for peer in merge_duplicates(peers))


def hostfile_for(launcher: str, peers: Sequence[Peer]) -> str:
    return openmpi_hostfile(peers) if launcher == "openmpi" else hydra_hostfile(peers)
