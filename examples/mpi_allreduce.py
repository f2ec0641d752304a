"""Every rank contributes rank+1; the allreduce must give n(n+1)/2 on every rank."""

import os
import socket
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
expected = comm.size * (comm.size + 1) // 2
library = MPI.Get_library_version().splitlines()[0][:40]
greeting = os.environ.get("ALLREDUCE_GREETING")  # the job's env, as every rank sees it
print(f"rank {comm.rank}/{comm.size} on {socket.gethostname()}: allreduce sum={total} "
      f"(expected {expected}) [{library}]" + (f" {greeting}" if greeting else ""), flush=True)
if comm.rank == 0:
    # one write, newline included: mpirun interleaves the ranks' writes, not their lines
    sys.stdout.write(f"allreduce result: {total} {'OK' if total == expected else 'WRONG'}\n")
    sys.stdout.flush()
sys.exit(0 if total == expected else 1)
