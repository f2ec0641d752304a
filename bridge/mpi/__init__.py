"""MPI bootstrap: hostlists, peer discovery, hostfiles, SSH, launcher command lines."""
