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
