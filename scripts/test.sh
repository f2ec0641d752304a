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
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 "$@" || status=$?  # the slowest, to keep CI short

# every test that reaches Slurm (marked slurm) outside tests/integration/kubernetes: its own tests, the
# conformance suite's slurm engine (CLI, SSH, slurmrestd), the sbatch oracle, tenants' job environments and the
# tests that run one workload on Slurm and elsewhere. The operator's tests (tests/integration/kubernetes, ~8 min
# a release) run on 22.05 only, to keep a cold CI (~85 min with them on 24.11) well inside its limit: the
# operator reaches Slurm through the same adapters the conformance suite tests on every release.
for release in $matrix; do
  echo "=== Slurm $release" >&2
  started=$SECONDS
  HPCBRIDGE_SLURM="$release" .venv/bin/python -m pytest -p no:cacheprovider --durations=15 -m slurm \
    --ignore=tests/integration/kubernetes tests/integration || status=$?
  echo "=== Slurm $release: $((SECONDS - started)) s" >&2
done
exit "$status"
