"""Every process contributes its id; an allgather across processes must give [0, 1, ..., n-1] everywhere.

Written as for Kubeflow's jax-distributed runtime: the coordinates come from JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID, which hpcbridge launch sets on every backend (on CPU: JAX_PLATFORMS=cpu).
"""

import os

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                           num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))
gathered = multihost_utils.process_allgather(jnp.array([jax.process_index()]))
expected = list(range(jax.process_count()))
print(f"process {jax.process_index()}/{jax.process_count()}: allgather {gathered.ravel().tolist()}", flush=True)
if jax.process_index() == 0:
    print(f"allgather result: {'OK' if gathered.ravel().tolist() == expected else 'WRONG'}", flush=True)
jax.distributed.shutdown()
