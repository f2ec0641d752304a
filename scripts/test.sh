#!/usr/bin/env bash
# Set up everything (scripts/setup.sh --all), lint, type-check, and run the whole test suite: unit tests and the
# integration tests that drive real processes and daemons. Extra arguments go to pytest.
#
# Then the Slurm version matrix: the tests that use Slurm again on each release of HPCBRIDGE_SLURM_MATRIX
# (default "24.11 26.05"; Debian's packages, built once into ~/.cache/hpcbridge/ by
# tests/harness/slurm_versions.py), the main run being this machine's 22.05. With pytest arguments the matrix
# runs only if HPCBRIDGE_SLURM_MATRIX is set; set it empty to skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --all
.venv/bin/ruff check bridge tests bench scripts
.venv/bin/mypy  # strict on bridge/ ([tool.mypy] in pyproject.toml)
.venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"  # docs/: every link and page resolves

matrix="24.11 26.05"
[ "$#" -gt 0 ] && matrix=""
matrix="${HPCBRIDGE_SLURM_MATRIX-$matrix}"

status=0
.venv/bin/python -m pytest -p no:cacheprovider "$@" || status=$?

# every test that reaches Slurm (marked slurm): its own tests, the conformance suite's slurm engine (CLI, SSH,
# slurmrestd), the sbatch oracle, the operator's Slurm clusters and the tests that run one workload on Slurm and
# elsewhere. On the last release the operator's tests (tests/integration/kubernetes, ~7 min) are left to the
# others, to keep CI well inside its limit: they reach Slurm through the same adapter the rest tests there.
last="${matrix##* }"
for release in $matrix; do
  echo "=== Slurm $release" >&2
  started=$SECONDS
  skip=()
  [ "$release" = "$last" ] && [ "$release" != "${matrix%% *}" ] && skip=(--ignore=tests/integration/kubernetes)
  HPCBRIDGE_SLURM="$release" .venv/bin/python -m pytest -p no:cacheprovider -m slurm "${skip[@]}" tests/integration \
    || status=$?
  echo "=== Slurm $release: $((SECONDS - started)) s" >&2
done
exit "$status"
