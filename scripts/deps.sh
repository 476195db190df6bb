#!/usr/bin/env bash
# Installs what building and testing gpureclaim needs and is missing (Debian/Ubuntu), and checks the CUDA
# Toolkit headers (at /usr/local/cuda, or CUDAToolkit_ROOT). Needs no GPU and no driver.
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v make >/dev/null || need+=(make)
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)             # tests/gpu/check_sources.sh: the GPU programs compile
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v nm >/dev/null || need+=(binutils)
command -v python3 >/dev/null || need+=(python3)
pkg-config --exists criterion 2>/dev/null || need+=(libcriterion-dev)
command -v groff >/dev/null || need+=(groff-base)   # tests/packaging: the man pages render without warnings
command -v zsh >/dev/null || need+=(zsh)             # tests/packaging: the zsh completion loads
command -v lintian >/dev/null || need+=(lintian)     # tests/packaging: the DEB passes lintian
command -v systemd-analyze >/dev/null || need+=(systemd) # tests/packaging: verifies the example units (runs none)
[[ -x /usr/sbin/slurmd && -x /usr/sbin/slurmctld && -x /usr/sbin/munged ]] && command -v srun >/dev/null ||
  need+=(slurmd slurmctld slurm-client munge)        # tests/packaging: a private single-node Slurm (test_slurm)
command -v dpkg-shlibdeps >/dev/null || need+=(dpkg-dev) # cpack -G DEB: Depends from dpkg-shlibdeps
command -v file >/dev/null || need+=(file)           # cpack -G DEB: finds the binaries to strip
# tests/packaging: the wheel, built offline with Debian's pip, setuptools and wheel, in a venv; the pod spec
# parsed as YAML.
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import setuptools, wheel, venv, pip, yaml' 2>/dev/null ||
  need+=(python3-pip python3-setuptools python3-wheel python3-venv python3-yaml)
pkg-config --exists ncurses 2>/dev/null || need+=(libncurses-dev) # gpureclaim top (the command only)
command -v tmux >/dev/null || need+=(tmux)                            # tests/cli/test_top_tmux.py

if ((${#need[@]})); then
  echo "scripts/deps.sh: installing ${need[*]}"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null ||
    { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
fi

cuda="${CUDAToolkit_ROOT:-/usr/local/cuda}"
if [[ ! -f "$cuda/include/cuda.h" ]]; then
  echo "scripts/deps.sh: the CUDA Toolkit headers were not found at $cuda/include (set CUDAToolkit_ROOT);" >&2
  echo "  gpureclaim builds against CUDA 12.x or 13.x headers (no GPU or driver needed)" >&2
  exit 1
fi
