"""The sbatch language, as Slurm 22.05's sbatch reads it: a leaf that the planner, the conversion to a TrainJob
and the Slurm adapter share, importing only the foundation.

* ``options``: sbatch's option table (long names, arguments, short letters), the options that set one thing,
  the ones hpc-bridge refuses, and each option's value check;
* ``values``: Slurm's value grammars (time limits, sizes, node counts, GPU counts, GRES, job arrays);
* ``directives``: options as arguments — ``get_argument`` tokenising, ``getopt_long``, the request and sbatch's
  last-wins merge, command-line flags; and the one writer of a ``#SBATCH`` line;
* ``script``: a batch script — sbatch's checks, the directive block and the body, ``#HPCBRIDGE`` lines.

The submodules are imported by name (``from bridge.sbatch.values import …``): a caller that needs only the
value grammars does not build the option table's checks.
"""
