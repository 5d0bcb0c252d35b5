#!/usr/bin/env bash
# Wheels that scripts/device_check.sh installs on a GPU machine of this workplace (the `device` tool): its
# image has python3 3.12 with CUDA torch, transformers, peft, accelerate and pytest, but no network and none
# of capo-gym's own light dependencies that the GPU checks import (gymnasium). Run here, once; the wheels
# land in .whl/ (git-ignored), which the device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
rm -rf .whl && mkdir -p .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "gymnasium==1.4.0" "farama-notifications==0.0.4"  # the image has numpy, cloudpickle, typing-extensions
ls -la .whl
