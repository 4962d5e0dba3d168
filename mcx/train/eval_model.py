"""``python -m mcx.train.eval_model EVAL_DIR``: an evaluation job (mcx.eval.job) through the harness's model
interface over the run's own Megatron-Core model (mcx.eval.megatron_lm, D72), with no Hugging Face export.

The model is built as the training worker builds it (model.py: the spec's TransformerConfig and MCore's local
layer spec, one process, no parallelism; cpu.py's adaptations on CPU) and its full stage's final checkpoint is
loaded as canonical weights (mcx.weights: a CPU run's state.pt or a distributed checkpoint of any layout), so a
run trained with TP, PP or EP on GPUs is evaluated on one device. The tokenizer is the run's dataset's.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from attrs import evolve

from mcx.contract.checkpoints import checkpoint_path, checkpoint_root
from mcx.contract.job import dataset_dir, read_job as read_train_job
from mcx.contract.result import read_stage_result
from mcx.data.dataset import read_manifest
from mcx.data.tokenizer import Tokenizer, load_saved
from mcx.errors import InputError
from mcx.eval.job import read_job
from mcx.plan.layout import Layout
from mcx.plan.params import padded_vocab_size
from mcx.spec.schema import ExperimentSpec
from mcx.train import model as model_lib
from mcx.train.runtime import seed_everything
from mcx.weights.canonical import check_fits, is_extra_state, with_vocab_rows
from mcx.weights.checkpoint_files import STATE_FILE
from mcx.weights.sources import Format, open_weights

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@contextlib.contextmanager
def one_process(device: str) -> Iterator[None]:
    """A one-rank process group and MCore's parallel state of degree 1 (GPTModel's layers ask it their ranks)."""
    from megatron.core import parallel_state

    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        if owns:
            dist.destroy_process_group()


def eval_spec(spec: ExperimentSpec) -> ExperimentSpec:
    """The spec the evaluation model is built from: FP8 runs compute in bf16 (the local layer spec has no FP8;
    their weights are bf16), and nothing of training's recomputation."""
    precision = "bf16" if spec.train.precision.startswith("fp8") else spec.train.precision
    return evolve(spec, train=evolve(spec.train, precision=precision, recompute_granularity="none", te_op_fuser=False,
                                                             cuda_graphs=False))


@torch.no_grad()
def load_model(stage: Path, device: str, step: int | None = None) -> tuple[torch.nn.Module, Tokenizer, int, str]:
    """The full stage's final checkpoint (or ``step``'s) as a one-process GPTModel in eval mode on ``device``;
    also the run's tokenizer, its vocabulary size and the model's dtype name."""
    train_job = read_train_job(stage)
    result = read_stage_result(stage)
    if result is None or not result.steps:
        raise InputError(f"{stage} has no finished steps to evaluate;", "evaluate a run whose full stage finished.")
    spec = eval_spec(train_job.spec)
    data = dataset_dir(spec.data, Path(train_job.data_dir), next(iter(spec.data.datasets().values()))[1])
    tokenizer = load_saved(data, read_manifest(data)["tokenizer"]["kind"])
    vocab = spec.model.vocab_size or tokenizer.vocab_size
    checkpoint = checkpoint_path(checkpoint_root(stage), step or result.steps)
    fmt: Format = "torch" if (checkpoint / STATE_FILE).is_file() else "dist"
    seed_everything(spec.train.seed)
    if device == "cuda":
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(spec.train.seed)
    config = model_lib.transformer_config(spec, Layout(), device, "local")
    padded = padded_vocab_size(vocab, spec.model.make_vocab_size_divisible_by, 1)
    model = model_lib.build_model_chunk(spec, config, model_lib.gpt_layer_spec(spec, "local"), padded)
    if device != "cuda":
        from mcx.train.cpu import adapt_model

        adapt_model(model)
    weights = with_vocab_rows(open_weights(checkpoint, fmt), padded, vocab)
    own = model.state_dict()
    check_fits(weights, {k: tuple(v.shape) for k, v in own.items() if isinstance(v, torch.Tensor)}, str(checkpoint))
    for name, tensor in own.items():  # one source tensor read at a time
        if not is_extra_state(name):
            tensor.copy_(weights[name])
    held: torch.nn.Module = model
    if device == "cuda":  # as the worker holds it (gpu.py): on the GPU, in bf16/fp16 behind Float16Module
        model.cuda(torch.cuda.current_device())  # the torch norms are built on the host
        if config.fp16 or config.bf16:
            from megatron.core.transformer.module import Float16Module

            held = Float16Module(config, model)  # the norms in bf16 too, the logits back in fp32
    held.eval()
    return held, tokenizer, vocab, DTYPE_NAMES.get(config.params_dtype, str(config.params_dtype))


def evaluate(directory: Path) -> Path:
    """Run the evaluation job in ``directory`` on the Megatron-Core model; returns its scores file."""
    from mcx.eval.megatron_lm import MegatronLM
    from mcx.eval.worker import evaluate as run_harness

    started = time.monotonic()
    job = read_job(directory)
    with one_process(job.device):
        step = job.model.get("step")  # a checkpoint of the run's (``{"run": ID, "step": "N"}``), else its final one
        model, tokenizer, vocab, dtype = load_model(Path(job.model_dir) / "full", job.device,
                                                    int(step) if step else None)
        spec_model = read_train_job(Path(job.model_dir) / "full").spec.model
        device = model_lib.device_of(job.device)
        lm = MegatronLM(model, tokenizer, vocab_size=vocab, batch_size=job.settings.batch_size, device=device,
                        max_length=spec_model.max_position_embeddings or spec_model.seq_length)
        return run_harness(directory, lm, dtype=dtype, started=started)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mcx.train.eval_model EVAL_DIR", file=sys.stderr)
        return 2
    evaluate(Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
