#!/usr/bin/env bash
# Set up hpc-bridge on a fresh Debian 12 machine.
#   scripts/setup.sh        what the local cluster needs: Open MPI, a venv with hpc-bridge[examples] (mpi4py)
#   scripts/setup.sh --all  everything the test suite needs too: MPICH, sshd, Slurm + munge, containerd + runc +
#                           CNI plugins + debootstrap (real Kubernetes nodes), the staging, kubernetes and
#                           operator extras, PyTorch, JAX and XGBoost (CPU use), the dev tools
# Each checkout has a thin venv of its own, ~/.cache/hpcbridge/venvs/<checkout>-<hash of its path> (override
# with HPCBRIDGE_VENV; .venv in the checkout links to it) over a dependencies' venv shared by content.
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

# Two venvs. The dependencies' venv holds every third-party package (torch, jax, ... about 6 GB with --all) and is
# shared: it is keyed by the dependency lists it was made from, so any checkout with the same lists reuses it. The
# checkout's venv is thin (a few MB, ~/.cache/hpcbridge/venvs/<checkout>-<hash of its path>, .venv links to it): it
# holds this checkout's editable install, sees the dependencies' venv through a .pth file, and has its own copy of
# their commands. An editable install in a shared venv ran whichever checkout set it up last.
checkout="$(pwd -P)"
mode=base
[ "$all" = 1 ] && mode=all
extras=examples
[ "$all" = 1 ] && extras=examples,dev,docs,staging,kubernetes,operator
requirements="$(python3 - "$extras" <<'PY'
import sys, tomllib
pyproject = tomllib.load(open("pyproject.toml", "rb"))
project = pyproject["project"]
# the build backend too: the checkout's editable install is built with these packages, offline
wanted = list(project["dependencies"]) + list(pyproject["build-system"]["requires"])
extras = project.get("optional-dependencies", {})
for extra in sys.argv[1].split(","):
    wanted += [req for req in extras[extra] if not req.startswith("hpc-bridge")]
print("\n".join(sorted(set(wanted))))
PY
)"
# bump DEPS_RECIPE when a step below changes what the dependencies' venv holds
DEPS_RECIPE=1
deps_key="$(printf '%s\n' "$DEPS_RECIPE" "$mode" "$(python3 -V)" "$requirements" | sha256sum | cut -c1-16)"
deps="$HOME/.cache/hpcbridge/venvs/deps-$mode-$deps_key"
pip_in() { "$1/bin/python" -m pip install -q "${@:2}"; }
if [ ! -f "$deps/complete" ]; then
  echo "setup: creating $deps (third-party packages; shared by checkouts with the same dependencies)" >&2
  rm -rf "$deps"
  mkdir -p "$(dirname "$deps")"
  python3 -m venv "$deps"
  printf '%s\n' "$requirements" > "$deps/requirements.txt"
  # the examples extra is mpi4py, for whichever MPI it finds first at run time: the wheel carries both ABIs
  pip_in "$deps" -r "$deps/requirements.txt"
  if [ "$all" = 1 ]; then
    # not flux: the tests use the bindings built with their own flux-core, never PyPI's
    # torch from PyPI; the examples and tests use it on CPU with the gloo backend
    pip_in "$deps" torch numpy
    # jax (CPU) for the JAX example and its tests on the jax-distributed runtime
    pip_in "$deps" 'jax[cpu]'
    # XGBoost without CUDA (a 6 MB wheel, not xgboost's 300 MB one) for the example and tests on xgboost-distributed
    pip_in "$deps" xgboost-cpu
  fi
  touch "$deps/complete"
fi

if [ -n "${HPCBRIDGE_VENV:-}" ]; then
  venv="$HPCBRIDGE_VENV"
elif [ -d .venv ] && [ ! -L .venv ]; then
  venv="$(cd .venv && pwd -P)"  # a venv directory of the user's own
else
  venv="$HOME/.cache/hpcbridge/venvs/$(basename "$checkout")-$(printf '%s' "$checkout" | sha256sum | cut -c1-12)"
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  python3 -m venv --without-pip "$venv"
fi
printf '%s\n' "$checkout" > "$venv/checkout"
# thin venvs whose checkout this machine no longer sees are named, not removed: a home shared with other machines
# or containers may hold a checkout that is only theirs
for other in "$HOME"/.cache/hpcbridge/venvs/*/; do
  other="${other%/}"
  [ -f "$other/checkout" ] && [ "$other" != "$venv" ] && [ ! -d "$(cat "$other/checkout")" ] || continue
  echo "setup: note: $other is the venv of $(cat "$other/checkout"), not found here; rm -rf it if that is gone" >&2
done
if [ "$(cd .venv 2>/dev/null && pwd -P)" != "$(cd "$venv" && pwd -P)" ]; then
  rm -f .venv
  ln -s "$venv" .venv
fi
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
deps_site="$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
# addsitedir, not a bare path: the dependencies' own .pth files (namespace packages) are processed too
printf 'import site; site.addsitedir(%s)\n' "'$deps_site'" > "$site/_hpcbridge_deps.pth"
rm -f "$site"/__editable__*hpc_bridge* "$site"/__editable__*hpc-bridge*
# compat editable mode: a plain path entry instead of an import hook every Python start-up pays for (~10 ms,
# on every node of every job that starts `hpcbridge launch`)
"$deps/bin/python" -m pip --python "$venv/bin/python" install -q --no-deps --no-build-isolation \
  --config-settings editable_mode=compat -e .
# the dependencies' commands (pytest, mypy, mkdocs, ...), run by this venv's Python so they import this checkout
for tool in "$deps"/bin/*; do
  [ -f "$tool" ] || continue
  name="$(basename "$tool")"
  case "$name" in python*|pip*|activate*|Activate*|hpcbridge) continue ;; esac
  if head -c 512 "$tool" | head -1 | grep -q "^#!$deps/bin/python"; then
    { printf '#!%s\n' "$venv/bin/python"; tail -n +2 "$tool"; } > "$venv/bin/$name.new"
    chmod +x "$venv/bin/$name.new"
    mv "$venv/bin/$name.new" "$venv/bin/$name"
  else
    ln -sf "$tool" "$venv/bin/$name"  # a native program (ruff)
  fi
done
if [ "$all" = 1 ]; then
  # torchtune for Kubeflow's torchtune runtimes (tests/integration/test_torchtune.py), beside the venv, not in it:
  # its pins (torchdata, kagglehub) must not move the venv's torch. These versions run with it on CPU: torchao
  # 0.13 (0.12 does not import with torch 2.15, 0.18 dropped what torchtune imports), kagglehub < 1 (1.x needs
  # kagglesdk). The tests put the directory on the jobs' PYTHONPATH and its bin/ on their PATH.
  torchtune="$HOME/.cache/hpcbridge/torchtune-0.6.1"
  if [ ! -f "$torchtune/complete" ]; then
    rm -rf "$torchtune"
    pip_in "$deps" --no-deps --target "$torchtune/site" torchtune==0.6.1 torchao==0.13.0 torchdata==0.11.0 \
      kagglehub==0.3.12 datasets==5.2.0 multiprocess==0.70.19 dill==0.4.1 xxhash==4.1.0 pyarrow==26.0.1 \
      pandas==3.1.1 pytz==2026.6 tzdata==2026.6 safetensors==0.8.0 sentencepiece==0.2.3 tiktoken==0.14.0 \
      blobfile==3.3.0 pycryptodomex==3.24.2 lxml==6.2.0 tokenizers==0.23.3 omegaconf==2.4.0 \
      antlr4-python3-runtime==4.9.3 psutil==7.2.2 pillow==13.0.0 regex==2026.12.2
    touch "$torchtune/complete"
  fi
fi
echo "setup: ready ($("$venv/bin/hpcbridge" --help >/dev/null && echo "hpcbridge $("$venv/bin/python" -c 'import bridge; print(bridge.__version__)')"))" >&2
