"""Conversions between foreign job formats and TrainJobs (sbatch scripts, Training Operator v1 jobs)."""
