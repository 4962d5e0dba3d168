"""The experiment spec: frozen attrs classes that know nothing about TOML or JSON.

Field names follow Megatron-LM's arguments where one exists (``--num-query-groups`` ->
``num_query_groups``), so users recognise them; docs/spec.md maps every key to its flag.
Derived values (data-parallel size, smoke shapes, recommended degrees) live in the plan.
"""

from __future__ import annotations

from typing import Literal

from attrs import field, frozen

Normalization = Literal["RMSNorm", "LayerNorm"]
PositionEmbedding = Literal["rope", "learned_absolute", "none"]
TransformerImpl = Literal["auto", "local", "transformer_engine"]
LoadBalancing = Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"]
Dispatcher = Literal["alltoall", "allgather"]
Precision = Literal["bf16", "fp16", "fp32", "fp8-hybrid", "fp8-e4m3"]
Fp8Recipe = Literal["delayed", "tensorwise"]
AmaxAlgo = Literal["max", "most_recent"]
DecayStyle = Literal["cosine", "linear", "constant", "inverse-square-root", "WSD"]
RecomputeGranularity = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
LauncherKind = Literal["local", "torchrun", "slurm"]
GpuModel = Literal["H200", "H100", "A100-80GB", "A100-40GB", "L40S", "B200", "cpu", "any"]
TokenizerKind = Literal["bpe", "huggingface", "sentencepiece", "gpt2"]
SweepMethod = Literal["grid", "random", "tpe"]
Direction = Literal["minimize", "maximize"]
SweepValue = bool | int | float | str


@frozen(kw_only=True)
class ModelSpec:
    preset: str | None = None
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int | None = None  # None: multi-head attention (groups = heads)
    ffn_hidden_size: int | None = None  # None: 4 * hidden_size
    kv_channels: int | None = None  # None: hidden_size / num_attention_heads
    vocab_size: int | None = None  # None: the tokenizer's vocabulary
    make_vocab_size_divisible_by: int = 128
    seq_length: int
    max_position_embeddings: int | None = None  # None: seq_length
    normalization: Normalization = "RMSNorm"
    norm_epsilon: float = 1e-5
    swiglu: bool = True
    position_embedding_type: PositionEmbedding = "rope"
    rotary_base: int = 10000
    rotary_percent: float = 1.0
    rope_scaling: bool = False  # LLaMA 3.x: low frequencies divided by rope_scaling_factor
    rope_scaling_factor: float = 8.0
    untie_embeddings_and_output_weights: bool = True
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    transformer_impl: TransformerImpl = "auto"
    # Mixture of experts (Mixtral style); num_experts unset means a dense model.
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_router_load_balancing_type: LoadBalancing = "aux_loss"
    moe_aux_loss_coeff: float = 0.01
    moe_ffn_hidden_size: int | None = None  # None: ffn_hidden_size
    moe_token_dispatcher_type: Dispatcher = "alltoall"
    moe_grouped_gemm: bool = False


@frozen(kw_only=True)
class ParallelSpec:
    # None: let the planner choose (recommendation shown by `mcx plan`).
    tensor: int | None = None
    pipeline: int | None = None
    virtual_pipeline: int | None = None
    context: int | None = None
    expert: int | None = None
    sequence_parallel: bool = False
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True


@frozen(kw_only=True)
class TrainSpec:
    micro_batch_size: int = 1
    global_batch_size: int
    train_iters: int
    lr: float
    min_lr: float = 0.0
    lr_decay_style: DecayStyle = "cosine"
    lr_warmup_iters: int = 0
    lr_decay_iters: int | None = None  # None: train_iters
    weight_decay: float = 0.1
    clip_grad: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    precision: Precision = "bf16"
    fp8_recipe: Fp8Recipe = "delayed"
    fp8_amax_history_len: int = 1024
    fp8_amax_compute_algo: AmaxAlgo = "max"
    fp8_attention: bool = False  # FP8 precisions: attention (cuDNN's fused attention) in FP8 too
    te_op_fuser: bool = False  # Transformer Engine: each dense MLP as one fused op sequence (D29)
    grad_reduce_in_bf16: bool = False
    gradient_accumulation_fusion: bool = True  # GPU: weight gradients accumulated into fp32 by the GEMM
    cross_entropy_fusion: bool = True  # GPU, bf16 parameters, not deterministic: Megatron's fused loss
    rope_fusion: bool = True  # GPU: Transformer Engine's fused RoPE, or MCore's RoPE torch.compile'd (local spec)
    expandable_segments: bool = False  # GPU: torch's expandable-segments allocator (fewer fragments; D23, D27)
    # GPU, one GPU: each step's forward and backward captured once as one CUDA graph (Megatron-Core's full-iteration
    # graph) and replayed, which removes the host's per-layer time from small models' steps (D75)
    cuda_graphs: bool = False
    recompute_granularity: RecomputeGranularity = "none"
    recompute_method: RecomputeMethod = "uniform"
    recompute_num_layers: int = 1
    seed: int = 1234
    deterministic: bool = False
    eval_interval: int = 100
    eval_iters: int = 10
    log_interval: int = 1
    # Divergence guard: stop when the loss is NaN/Inf or exceeds spike_factor x its recent mean.
    loss_spike_factor: float = 3.0
    loss_spike_window: int = 20


@frozen(kw_only=True)
class TokenizerSpec:
    kind: TokenizerKind = "bpe"
    path: str | None = None  # tokenizer.json, a SentencePiece model, or a GPT-2 vocab.json
    merges: str | None = None  # GPT-2 merges.txt
    vocab_size: int = 8192  # for kind = "bpe" trained on the corpus


@frozen(kw_only=True)
class MixComponent:
    """One prepared dataset of a mixture and its sampling weight (relative: the weights are normalised)."""

    path: str  # DVC-tracked dataset directory (prepared by `mcx data prepare`), relative to the project
    prefix: str = "corpus"  # <path>/<prefix>.bin / .idx
    weight: float


@frozen(kw_only=True)
class DataSpec:
    # One dataset (path) or a mixture ([data.mix.NAME]); exactly one of the two.
    path: str | None = None  # DVC-tracked dataset directory (prepared by `mcx data prepare`), relative to the project
    prefix: str = "corpus"  # <path>/<prefix>.bin / .idx
    split: str = "969,30,1"  # train,valid,test weights, as Megatron's --split (each component is split so)
    tokenizer: TokenizerSpec = field(factory=TokenizerSpec)
    # name -> component: Megatron's weighted --data-path. With valid or test set, mix is the training data
    # whole and each split reads its own mixture (Megatron's --train/--valid/--test-data-path; no split).
    mix: dict[str, MixComponent] = field(factory=dict)
    valid: dict[str, MixComponent] = field(factory=dict)
    test: dict[str, MixComponent] = field(factory=dict)

    @property
    def per_split(self) -> bool:
        """Whether validation and test read their own mixtures (Megatron's blend_per_split)."""
        return bool(self.valid or self.test)

    def datasets(self) -> dict[str, tuple[str, str, str]]:
        """Each prepared dataset the spec reads: name -> (its path's key, path, prefix). The name is ``dataset``
        for ``path``, ``mix.NAME`` / ``valid.NAME`` / ``test.NAME`` for a mixture's components (as the data
        component of the run ID and the realised mixture name them)."""
        if self.path is not None:
            return {"dataset": ("data.path", self.path, self.prefix)}
        return {f"{table}.{name}": (f"data.{table}.{name}.path", part.path, part.prefix)
                for table, mixture in (("mix", self.mix), ("valid", self.valid), ("test", self.test))
                for name, part in mixture.items()}


@frozen(kw_only=True)
class CheckpointSpec:
    dir: str | None = None  # None: <run dir>/checkpoints
    interval: int = 0  # 0: only at the end of a stage
    final: bool = True  # save when the stage ends (false: only every `interval` steps, on preemption and in the smoke stage)
    async_save: bool = True
    keep: int = 2
    track_intermediate: bool = False  # add intermediate checkpoints to DVC too


@frozen(kw_only=True)
class SmokeSpec:
    enabled: bool = True
    num_layers: int = 2
    hidden_size: int | None = None  # None: min(model.hidden_size, 256)
    ffn_hidden_size: int | None = None  # None: scaled with hidden_size
    num_attention_heads: int | None = None  # None: fits hidden_size and the layout
    seq_length: int | None = None  # None: min(model.seq_length, 256)
    num_experts: int | None = None  # None: min(model.num_experts, 4)
    train_iters: int = 30
    global_batch_size: int | None = None  # None: smallest valid for the layout
    lr: float | None = None  # None: the spec's lr
    data_fraction: float = 0.05
    resume_check_iters: int = 3
    loss_window: int = 5
    min_loss_drop: float = 0.01  # final window mean must be below the first window mean by more than this (noise)
    # Where the smoke stage runs. None: one node of the full stage's, and its parallel degrees shrunk
    # until they fit that node and the smaller model (a 405B spec smoke-tests on one node).
    nodes: int | None = None
    gpus_per_node: int | None = None
    # The smoke job's Slurm time limit. None: the plan's estimate for the smoke stage (mcx.plan.smoketime).
    time_limit: str | None = None
    # None: hardware.gpu. "cpu": the smoke stage runs as CPU processes (gpus_per_node of them a node),
    # as the CPU backend trains: data parallel, fp32, the local layer spec (a cluster without GPUs).
    gpu: GpuModel | None = None
    tensor: int | None = None
    pipeline: int | None = None
    context: int | None = None
    expert: int | None = None


@frozen(kw_only=True)
class HardwareSpec:
    nodes: int = 1
    gpus_per_node: int = 1
    gpu: GpuModel = "any"


@frozen(kw_only=True)
class SlurmSpec:
    partition: str | None = None
    account: str | None = None
    time: str = "04:00:00"
    qos: str | None = None
    constraint: str | None = None
    signal_grace_seconds: int = 120
    requeue: bool = True
    extra_sbatch: tuple[str, ...] = ()


@frozen(kw_only=True)
class ContainerSpec:
    """The image the worker runs in: pyxis (srun --container-image) under Slurm, Podman for local and torchrun
    launches. Unset (no image), the worker runs on the host and the run ID is as it was (D67)."""

    image: str | None = None  # a .sqsh file (pyxis), a local Podman image, or name@sha256:<digest>
    mounts: tuple[str, ...] = ()  # "HOST:CONTAINER[:ro]", beside the directories the job reads (mounted by mcx)
    workdir: str | None = None  # None: the stage directory
    env: tuple[str, ...] = ()  # names of host variables the worker sees inside (their host values)
    python: str | None = None  # the interpreter inside the image; None: this one's path (sys.executable)


@frozen(kw_only=True)
class WatchdogSpec:
    """The hang watchdog beside each node's torchrun agent (mcx.launch.watchdog, docs/runs.md "Hangs")."""

    enabled: bool = True
    max_restarts: int = 2  # hangs a stage is restarted after (from its newest checkpoint) before it fails
    step_factor: float = 10.0  # no step for step_factor x the step time (measured, or the plan's) is a hang
    min_seconds: int = 900  # ... and never less than this (a checkpoint save, an evaluation)
    startup_seconds: int = 1800  # the bound before an attempt's first step (imports, model, data, resume)


@frozen(kw_only=True)
class LaunchSpec:
    kind: LauncherKind = "local"
    master_port: int | None = None  # None: a free port
    slurm: SlurmSpec = field(factory=SlurmSpec)
    container: ContainerSpec = field(factory=ContainerSpec)
    watchdog: WatchdogSpec = field(factory=WatchdogSpec)


@frozen(kw_only=True)
class TrackingSpec:
    uri: str | None = None  # None: MLFLOW_TRACKING_URI, else the embedded store under .mcx/
    experiment: str | None = None  # None: the spec's name
    dvc_remote: str | None = None  # None: the project's default DVC remote, else the embedded one under .mcx/
    log_checkpoints: bool = True
    system_metrics_interval_s: float = 10.0  # GPU and host sampling on every node (mcx.train.system_metrics); 0: off


@frozen(kw_only=True)
class BaselineSpec:
    run: str | None = None  # an mcx run ID or a named baseline
    tolerances: dict[str, float] = field(factory=dict)  # metric -> allowed relative increase


@frozen(kw_only=True)
class InitSpec:
    """Where the weights start: random (unset), another run's checkpoint, or a model directory."""

    source: str | None = field(default=None, metadata={"key": "from"})  # run:<id>, hf:<dir>, megatron:<dir>
    step: int | None = None  # run:<id> only: that step's checkpoint; None: the run's final checkpoint
    load_optimizer: bool = False  # also the optimizer state (run: and megatron: sources)
    reset_step: bool = True  # count steps, schedule and data from 0; false: continue from the source's step


@frozen(kw_only=True)
class SweepRange:
    """A parameter's range (methods random and tpe): ``low`` to ``high``, on a log scale with ``log``, in
    steps of ``step``; a key whose values are integers gets integers."""

    low: float
    high: float
    log: bool = False
    step: float | None = None


@frozen(kw_only=True)
class SweepSpec:
    """Many runs as one experiment (`mcx sweep`): each trial is the spec with its parameters' values set."""

    method: SweepMethod = "grid"
    # spec key -> its values (a grid's axis; choices for random and tpe) or a range
    parameters: dict[str, tuple[SweepValue, ...] | SweepRange]
    objective: str = "valid_loss"  # a summary metric (docs/metrics.md)
    direction: Direction | None = None  # None: the metric's own (lower is better: minimize)
    max_trials: int | None = None  # None: every grid point (grid only)
    parallel: int = 1  # trials at once
    seed: int = 0  # the search's own: the same sweep proposes the same trials
    prune: bool = False  # stop trials whose validation objective trails the median of the others'
    prune_startup_trials: int = 2  # trials that run whole before any is pruned
    prune_warmup_evals: int = 1  # evaluations of a trial before it can be pruned
    name: str | None = None  # None: the spec's name


@frozen(kw_only=True)
class BudgetSpec:
    max_gpu_hours: float | None = None  # None: no gate
    assumed_mfu: float | None = None  # overrides the step-time model's estimate (mcx.plan.steptime)
    gpu_hour_price: float | None = None  # currency units per GPU-hour, for the cost line


@frozen(kw_only=True)
class PerturbSpec:
    """Add ``amount`` to every floating-point model weight just before step ``step`` (the optimizer
    state is left alone): a run that must depart from its original exactly there."""

    step: int
    amount: float = 1e-2


@frozen(kw_only=True)
class OutputPerturbSpec:
    """Add ``amount`` to one module's forward output in one micro-batch of one step, on every rank: a fault
    at a known operation, which `mcx locate` must name (docs/reproduce.md)."""

    step: int
    micro_batch: int = 0  # 0-based, within the step (each data-parallel rank's own micro-batches)
    module: str  # a module path as `mcx locate` names it, e.g. "decoder.layers.1.mlp.linear_fc2"
    amount: float = 1e-2


@frozen(kw_only=True)
class DebugSpec:
    """Fault injection, to test what watches a run: ``mcx reproduce``'s verdict, the divergence guard.
    Part of the config hash (a run with faults is another run); unset, it leaves the run ID as it was."""

    perturb_params: PerturbSpec | None = None
    nan_params_at_step: int | None = None  # every floating-point weight made NaN just before that step
    perturb_output: OutputPerturbSpec | None = None  # one module's output changed in one micro-batch of one step
    swap_micro_batches_at_step: int | None = None  # micro-batches 0 and 1 of that step trained in swapped order


@frozen(kw_only=True)
class EvalSpec:
    """Downstream evaluation with lm-evaluation-harness on the run's own weights, after its full stage (`mcx eval`).
    Not part of the run ID: the weights do not depend on how they are judged; unset, no table is recorded."""

    tasks: tuple[str, ...] = ()  # registry task names or local task directories (relative to the project); empty: off
    num_fewshot: int = 0  # examples put before each item
    limit: int | None = None  # items per task (the first N); None: every item
    batch_size: int = 8  # requests per forward pass
    # also evaluate the full stage's checkpoints at every multiple of this step (saved and kept for it), after the
    # stage; None or 0: only the final weights
    every: int | None = None
    # the harness's model: "megatron" (its model interface over the run's own Megatron-Core model) or "hf" (its
    # Hugging Face model on an export of the run); both give the same scores (D72). `mcx eval hf:DIR` is always "hf"
    model: Literal["hf", "megatron"] = "megatron"


@frozen(kw_only=True)
class ExperimentSpec:
    name: str
    description: str = ""
    model: ModelSpec
    parallel: ParallelSpec = field(factory=ParallelSpec)
    train: TrainSpec
    data: DataSpec
    checkpoint: CheckpointSpec = field(factory=CheckpointSpec)
    init: InitSpec = field(factory=InitSpec)
    smoke: SmokeSpec = field(factory=SmokeSpec)
    hardware: HardwareSpec = field(factory=HardwareSpec)
    launch: LaunchSpec = field(factory=LaunchSpec)
    tracking: TrackingSpec = field(factory=TrackingSpec)
    baseline: BaselineSpec = field(factory=BaselineSpec)
    budget: BudgetSpec = field(factory=BudgetSpec)
    sweep: SweepSpec | None = None
    eval: EvalSpec = field(factory=EvalSpec)
    debug: DebugSpec = field(factory=DebugSpec)
