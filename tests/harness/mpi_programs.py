"""Small MPI programs the tests and benchmarks compile with each implementation's mpicc."""

from __future__ import annotations

import subprocess
from pathlib import Path

#: every rank adds rank+1; rank 0 prints "allreduce result: N OK" (N = size*(size+1)/2), each rank its host
ALLREDUCE_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0; char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    int v = rank + 1;
    MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int expected = size * (size + 1) / 2;
    printf("rank %d/%d on %s: allreduce sum=%d (expect %d)\n", rank, size, host, sum, expected);
    if (rank == 0) printf("allreduce result: %d %s\n", sum, sum == expected ? "OK" : "WRONG");
    MPI_Finalize();
    return sum == expected ? 0 : 1;
}
"""


def build_allreduce(directory: Path, compiler: str, name: str | None = None) -> Path:
    """Compile ALLREDUCE_C with *compiler* (mpicc.openmpi, mpicc.mpich) into *directory*."""
    source = directory / "allreduce.c"
    source.write_text(ALLREDUCE_C)
    target = directory / (name or f"allreduce.{compiler.rsplit('.', 1)[-1]}")
    subprocess.run([compiler, "-O2", "-o", str(target), str(source)], check=True)
    return target
