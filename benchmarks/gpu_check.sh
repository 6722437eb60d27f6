#!/usr/bin/env bash
# What one GPU can prove about the CUDA/NCCL path (issue #29): one verdict line per check.
#   bash benchmarks/gpu_check.sh                       # on a GPU machine (about 2-3 minutes; at most 8)
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh  # the checks that apply on CPU/gloo (make test runs it)
# Exit status: 0 every check ok, 1 a check failed, 2 bad GPU_CHECK_DEVICE. Checks: benchmarks/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$PY" -P benchmarks/gpu_check.py  # -P: benchmarks/cloud.py must not shadow the cloud package
