# Sourced from the snapshot root (.snap/, see benchmarks/README.md): installs megatron-core, mcx's pure deps and
# Transformer Engine (pieces in /tmp/tc, carried as .te0-.te4) into /tmp/site.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
W=/tmp/tc/transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl
if [ ! -f /tmp/site/.ok ]; then
  cat /tmp/tc/tepart.* > $W && echo "$(md5sum $W)" && \
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site ../.whl/*.whl ../.tedeps/*.whl $W && touch /tmp/site/.ok || { echo INSTALL FAILED; exit 1; }
fi
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/res
python3 -c "from megatron.core.extensions.transformer_engine import HAVE_TE; import transformer_engine as te; print('HAVE_TE', HAVE_TE, te.__version__)" 2>&1 | tail -1
T=benchmarks/throughput.py; V=benchmarks/gpu_validation.py; S=experiments/h200_1gpu.toml; S2=experiments/h200_2gpu.toml
one() {  # one GPU NAME TIMEOUT ARGS...: one mcx run of the one-H200 spec on that GPU (micro-batch 4 unless ARGS say)
  local gpu=$1 name=$2 limit=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout $((limit + 5)) python3 $T --spec $S --steps 5 --warmup 2 --timeout $limit --impl te \
    --mbs 4 --runners mcx --work-dir /tmp/w/$name --out /tmp/res/throughput_1gpu_$name.json "$@" > $OUT/$name.log 2>&1
  rm -rf /tmp/w/$name; tail -n 3 $OUT/$name.log
}
two() {  # two NAME TIMEOUT ARGS...: one mcx run of the two-GPU 8B spec on both GPUs
  local name=$1 limit=$2; shift 2
  timeout $((limit + 5)) python3 $T --spec $S2 --gpus 2 --impl te --steps 4 --warmup 2 --runners mcx --timeout $limit \
    --work-dir /tmp/w/$name --out /tmp/res/throughput_2gpu_$name.json "$@" > $OUT/$name.log 2>&1
  rm -rf /tmp/w/$name; tail -n 3 $OUT/$name.log; pkill -9 -f mcx.train; sleep 2
}
