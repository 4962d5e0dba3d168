#!/bin/bash
# The GPU suite in one command, on the GPU machine, from the repository root's copy (benchmarks/README.md):
#
#   bash benchmarks/gpu/suite.sh OUT [--only NAME[,NAME...]] [--list] [-- EXTRA ARGS for the one task named]
#
# installs what the device call carried (.whl: Megatron-Core and mcx's pure dependencies into /tmp/site; .te:
# Transformer Engine 2.20.2 as one sm_90 wheel and its dependencies into /tmp/te; data/quickstart is read in
# place, unpacked first from .gpu/quickstart.tar.xz (outside data/, which DVC tracks) when that was carried instead: docs/gpu.md), then runs benchmarks/gpu/suite.py: the tasks named (default: gpu, gpu2, throughput-1gpu), writing
# OUT/junit.xml, OUT/summary.json and a log per task. `--list` names every task with its GPUs and minutes.
set -u
OUT=${1:?usage: bash benchmarks/gpu/suite.sh OUT [--only NAME[,NAME...]] [--list] [-- EXTRA ARGS]}
shift
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [ ! -f /tmp/site/.mcx-suite ]; then
  t0=$(date +%s)
  ls .whl/*.whl > /dev/null 2>&1 || { echo "suite: .whl/ is missing: carry it (benchmarks/README.md)"; exit 2; }
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  if ls .te/*.whl > /dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/te .te/*.whl || exit 1
  else
    echo "suite: no .te/ carried: Transformer Engine is not installed, its tests will fail"
  fi
  touch /tmp/site/.mcx-suite
  echo "suite: installed in $(( $(date +%s) - t0 )) s"
fi
if [ ! -d data/quickstart ] && [ -f .gpu/quickstart.tar.xz ]; then
  mkdir -p data && tar -xJf .gpu/quickstart.tar.xz -C data || exit 1
fi
export PYTHONPATH=/tmp/te:/tmp/site:$PWD
exec $PY benchmarks/gpu/suite.py "$OUT" "$@"
