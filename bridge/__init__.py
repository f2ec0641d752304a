"""hpc-bridge: one TrainJob, any cluster."""

__version__ = "0.1.0"
