#!/usr/bin/env bash
# The Python packages the lent GPU machine lacks, as cp312 manylinux wheels in .whl/ (ignored by git),
# for `make gpu-check` there (benchmarks/gpu_check.py installs them with pip --no-index --no-deps).
# That machine has Python 3.12, torch, Triton, pytest, numpy, matplotlib, attrs, psutil, pygments,
# packaging, python-dateutil, typing-extensions, coverage, sortedcontainers, ... but no network and no
# nbval, ipykernel or jupyter_client. Listed here: nbval and every requirement of it that the machine
# lacks (each wheel's Requires-Dist was checked against the machine's package list), the hypothesis
# the project pins, and Liger-Kernel (pure Python; a peer in bench_rotary.py). Versions are those of
# requirements.lock where it has them. Also writes .whl/COMMIT: the device copy has no .git.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PACKAGES=(
  nbval==0.11.0 ipykernel==7.4.0 jupyter_client==8.10.0 jupyter_core==5.9.1 nbformat==5.11.1
  traitlets==5.16.1 pyzmq==27.3.0 tornado==6.6.1 comm==0.2.3 debugpy==1.8.22
  ipython==9.18.1 ipython_pygments_lexers==1.1.1 matplotlib-inline==0.2.2 decorator==5.2.1
  jedi==0.20.1 parso==0.8.7 pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 wcwidth==0.9.4
  stack-data==0.6.3 executing==2.3.0 asttokens==3.0.2 pure_eval==0.2.4 platformdirs==4.14.7
  nest-asyncio2==1.7.4 fastjsonschema==2.22.3 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
  referencing==0.37.0 rpds-py==2026.9.1
  hypothesis==6.170.15
  liger-kernel==0.8.5
)
rm -rf .whl
mkdir -p .whl
# The device README's command: no dependencies, binary wheels for CPython 3.12 on x86-64 Linux.
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${PACKAGES[@]}"
git rev-parse HEAD > .whl/COMMIT 2>/dev/null || true
echo "$(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/ (the repository's tracked files: $(git ls-files -z | du -ch --files0-from=- | tail -1 | cut -f1); a device call carries 64 MiB)"
