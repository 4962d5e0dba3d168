#!/bin/bash
# The worker's node check (mcx.train.worker.check_node) and the one-node smoke stage on one H200, with and without
# Transformer Engine (issue 21). Run from the repository root on the GPU machine, carrying .whl (Megatron-Core and
# mcx's pure dependencies, benchmarks/README.md), .te (Transformer Engine 2.20.2 as one sm_90 wheel and its
# dependencies, docs/gpu.md) and data/quickstart. About 2.5 minutes.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/te .te/*.whl || exit 1
BASE=/tmp/site:$PWD; WITH_TE=/tmp/te:$BASE
PYTHONPATH=$WITH_TE python3 -c "import transformer_engine as te, megatron.core; print('TE', te.__version__)" 2>&1 | tail -1
S="experiments/h200_1gpu.toml --set model.num_layers=2 --set train.train_iters=20 --set train.eval_interval=10 --set train.lr_warmup_iters=2 --set model.transformer_impl=\"transformer_engine\""
echo "== 1. mcx run with Transformer Engine (smoke, then full)"
t0=$(date +%s)
PYTHONPATH=$WITH_TE timeout 420 python3 -m mcx run $S --json > $OUT/te_run.json 2> $OUT/te_run.err; echo "rc=$? in $(( $(date +%s) - t0 )) s"
PYTHONPATH=$BASE python3 - <<'PY'
import json, os
s = json.loads(open(os.environ["OUT"] + "/te_run.json").read().strip().splitlines()[-1])
print("status", s["status"], "exit", s["exit_code"], "error", s["error"])
for name, st in s["stages"].items():
    print(name, st["status"], st["layer_spec"], st["steps"], {k: c.get("passed") for k, c in (st["checks"] or {}).items()},
          "loss", (st["metrics"] or {}).get("train_loss"))
PY
echo "== 2. mcx run without Transformer Engine: refused before anything starts"
PYTHONPATH=$BASE timeout 120 python3 -m mcx run $S --set train.seed=7 > $OUT/note.out 2> $OUT/note.err; echo rc=$?; cat $OUT/note.err
echo "== 3. the worker without Transformer Engine on the smoke stage's cuda job"
D=$(ls -d .mcx/runs/*/smoke | head -1); mkdir -p /tmp/stage; cp $D/job.json /tmp/stage/
t0=$(date +%s%N); PYTHONPATH=$BASE python3 -m mcx.train /tmp/stage; echo "rc=$? in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
grep -o '"device": "[a-z]*"' /tmp/stage/job.json; cat /tmp/stage/worker.log | cut -c1-300
cp $D/worker.log $OUT/smoke_worker.log 2>/dev/null; cp .mcx/runs/*/full/worker.log $OUT/full_worker.log 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
