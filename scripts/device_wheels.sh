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
  -d .whl "gymnasium==1.4.0" "farama-notifications==0.0.4" \
  "pystemmer==3.1.0"  # SynthScholar's search stems its query; the image has numpy, cloudpickle, typing-extensions
# SmolLM2-135M-Instruct's config and tokenizer, without its weights (the GGUF is 98 MB, over what a device call
# carries): the device builds a randomly initialised model of its shape, to time `capo train` at that size.
smollm2="$("$python" -c 'from capo_train.models.smollm2 import ensure_smollm2; print(ensure_smollm2())' | tail -1)"
mkdir -p .whl/smollm2-shape
cp "$smollm2"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} .whl/smollm2-shape/
ls -la .whl .whl/smollm2-shape
