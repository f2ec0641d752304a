"""The Kubernetes operator (kopf) that runs TrainJobs managed by hpc-bridge. Imported only by `hpcbridge operator`."""
