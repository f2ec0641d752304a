#!/usr/bin/env bash
# Set up hpc-bridge on a fresh Debian 12 machine.
#   scripts/setup.sh        what the local cluster needs: Open MPI, a venv with hpc-bridge[examples] (mpi4py)
#   scripts/setup.sh --all  everything the test suite needs too: MPICH, sshd, Slurm + munge, containerd + runc +
#                           CNI plugins + debootstrap (real Kubernetes nodes), the staging, kubernetes and
#                           operator extras, PyTorch, JAX and XGBoost (CPU use), the dev tools
# Each checkout has its own venv, ~/.cache/hpcbridge/venvs/<checkout>-<hash of its path> (override with
# HPCBRIDGE_VENV); .venv in the checkout links to it.
# Re-running is cheap: packages already installed are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
[ "${1:-}" = "--all" ] && all=1

apt_packages=(openmpi-bin libopenmpi-dev python3-venv)
if [ "$all" = 1 ]; then
  apt_packages+=(mpich libmpich-dev openssh-server openssh-client iproute2 util-linux procps
                 slurm-wlm slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin
                 containerd runc containernetworking-plugins debootstrap sudo)
fi

missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# One venv per checkout: its editable install points at one checkout, so a venv two checkouts shared would run
# whichever set it up last. A .venv that already holds this checkout's install is kept (re-running stays cheap);
# otherwise the venv is keyed by the checkout's real path. Wheels come from pip's cache, not from another venv.
checkout="$(pwd -P)"
holds_this_checkout() {
  [ -x "$1/bin/python" ] && [ "$(cd / && "$1/bin/python" -c \
    'import os, bridge; print(os.path.dirname(os.path.dirname(os.path.realpath(bridge.__file__))))' \
    2>/dev/null)" = "$checkout" ]
}
if [ -n "${HPCBRIDGE_VENV:-}" ]; then
  venv="$HPCBRIDGE_VENV"
elif [ -d .venv ] && { [ ! -L .venv ] || holds_this_checkout "$checkout/.venv"; }; then
  venv="$(cd .venv && pwd -P)"  # a directory of its own, or a link to a venv of this checkout
else
  venv="$HOME/.cache/hpcbridge/venvs/$(basename "$checkout")-$(printf '%s' "$checkout" | sha256sum | cut -c1-12)"
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
fi
printf '%s\n' "$checkout" > "$venv/checkout"
# venvs whose checkout this machine no longer sees (a removed clone; each --all venv is about 6 GB) are named,
# not removed: a home shared with other machines or containers may hold a checkout that is only theirs
for other in "$HOME"/.cache/hpcbridge/venvs/*/; do
  other="${other%/}"
  [ -f "$other/checkout" ] && [ "$other" != "$venv" ] && [ ! -d "$(cat "$other/checkout")" ] || continue
  echo "setup: note: $other is the venv of $(cat "$other/checkout"), not found here; rm -rf it if that is gone" >&2
done
if [ "$(cd .venv 2>/dev/null && pwd -P)" != "$(cd "$venv" && pwd -P)" ]; then
  if [ -d .venv ] && [ ! -L .venv ]; then
    echo "setup: .venv is a venv directory of its own, not $venv: remove it, or leave HPCBRIDGE_VENV unset" >&2
    exit 2
  fi
  rm -f .venv
  ln -s "$venv" .venv
fi

pip=("$venv/bin/python" -m pip install -q)
# compat editable mode: a plain path entry instead of an import hook every Python start-up pays for (~10 ms,
# on every node of every job that starts `hpcbridge launch`)
editable=(--config-settings editable_mode=compat)
# the examples extra is mpi4py, for whichever MPI it finds first at run time: the wheel carries both ABIs
"${pip[@]}" "${editable[@]}" -e '.[examples]'
if [ "$all" = 1 ]; then
  # not flux: the tests use the bindings built with their own flux-core, never PyPI's
  "${pip[@]}" "${editable[@]}" -e '.[examples,dev,docs,staging,kubernetes,operator]'
  # torch from PyPI; the examples and tests use it on CPU with the gloo backend
  "$venv/bin/python" -c 'import torch' 2>/dev/null || "${pip[@]}" torch numpy
  # jax (CPU) for the JAX example and its tests on the jax-distributed runtime
  "$venv/bin/python" -c 'import jax' 2>/dev/null || "${pip[@]}" 'jax[cpu]'
  # XGBoost without CUDA (a 6 MB wheel, not xgboost's 300 MB one) for the example and tests on xgboost-distributed
  "$venv/bin/python" -c 'import xgboost' 2>/dev/null || "${pip[@]}" xgboost-cpu
  # torchtune for Kubeflow's torchtune runtimes (tests/integration/test_torchtune.py), beside the venv, not in it:
  # its pins (torchdata, kagglehub) must not move the venv's torch. These versions run with it on CPU: torchao
  # 0.13 (0.12 does not import with torch 2.15, 0.18 dropped what torchtune imports), kagglehub < 1 (1.x needs
  # kagglesdk). The tests put the directory on the jobs' PYTHONPATH and its bin/ on their PATH.
  torchtune="$HOME/.cache/hpcbridge/torchtune-0.6.1"
  if [ ! -f "$torchtune/complete" ]; then
    rm -rf "$torchtune"
    "${pip[@]}" --no-deps --target "$torchtune/site" torchtune==0.6.1 torchao==0.13.0 torchdata==0.11.0 \
      kagglehub==0.3.12 datasets==5.2.0 multiprocess==0.70.19 dill==0.4.1 xxhash==4.1.0 pyarrow==26.0.1 \
      pandas==3.1.1 pytz==2026.6 tzdata==2026.6 safetensors==0.8.0 sentencepiece==0.2.3 tiktoken==0.14.0 \
      blobfile==3.3.0 pycryptodomex==3.24.2 lxml==6.2.0 tokenizers==0.23.3 omegaconf==2.4.0 \
      antlr4-python3-runtime==4.9.3 psutil==7.2.2 pillow==13.0.0 regex==2026.12.2
    touch "$torchtune/complete"
  fi
fi
echo "setup: ready ($("$venv/bin/hpcbridge" --help >/dev/null && echo "hpcbridge $("$venv/bin/python" -c 'import bridge; print(bridge.__version__)')"))" >&2
