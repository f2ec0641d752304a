"""Datasets and models staged before the trainer starts, on the HPC backends (Slurm, Flux, local): the
``hpcbridge stage`` step, its sources (``hf://``, ``s3://``, ``file://``) and the shared cache it fills.
On Kubernetes the runtime's initializer jobs do this (bridge.adapters.kubernetes.render)."""
