"""The one table: every spec key and its Megatron-LM ``pretrain_gpt.py`` argument.

Each row says how a key travels between a spec and a Megatron-LM command line:

- ``value``: ``--flag VALUE`` carries the key's value;
- ``switch``: a store-true flag; present means ``true``;
- ``negated``: a store-false flag; present means ``false`` (``--disable-bias-linear``);
- ``rule``: several arguments or a conversion; the importer and exporter name the rule by the key;
- ``launcher``: a torchrun option or an ``#SBATCH`` line, not a ``pretrain_gpt.py`` argument;
- ``mcx``: mcx only; ``note`` says why Megatron-LM has no equivalent.

``absent`` is what Megatron-LM uses when a script leaves the argument out, in spec terms (checked
against megatron-core 0.19.2's ``megatron/training/arguments.py`` by tests/test_interop.py). Megatron-LM's
defaults often differ from mcx's (``--weight-decay`` 0.01 against 0.1, LayerNorm against RMSNorm), so an
import writes them into the spec: the imported experiment is the one the script runs. ``when`` names the
condition under which the key matters at all (fp8 settings only with fp8, MoE settings only with
experts); outside it the absent default is not applied and the exporter leaves the argument out unless
the spec sets a non-default value. Rows come in schema order, except that a row follows the rows it
reads (``ffn_hidden_size`` follows ``swiglu``). docs/spec.md is generated from this table
(mcx/interop/docgen.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Literal

from attrs import frozen

from mcx.plan.fusions import BF16_PARAMS
from mcx.plan.memory import ALLOCATOR_ENV, ALLOCATOR_VALUE

Kind = Literal["value", "switch", "negated", "rule", "launcher", "mcx"]


class Absent(enum.Enum):
    """What an argument's absence means when no plain value says it."""

    REQUIRED = "required"  # Megatron-LM needs the argument
    DERIVED = "derived"  # Megatron-LM computes it from other arguments (see the row's note)
    UNMATCHED = "unmatched"  # Megatron-LM's absence has no spec equivalent; the importer keeps mcx's default
    NA = "n/a"  # not a pretrain_gpt.py argument (launcher, mcx-only and rule rows)


REQUIRED, DERIVED, UNMATCHED, NA = Absent.REQUIRED, Absent.DERIVED, Absent.UNMATCHED, Absent.NA


@frozen
class Row:
    key: str
    kind: Kind
    args: tuple[str, ...]
    absent: Any
    doc: str
    note: str = ""
    when: str | None = None


def _flat_get(flat: Mapping[str, Any], key: str, default: Any = None) -> Any:
    return flat.get(key, default)


# Conditions under which a key matters, over a flat {dotted.key: value} view of a spec.
WHEN: dict[str, tuple[str, Callable[[Mapping[str, Any]], bool]]] = {
    "rope": ('model.position_embedding_type = "rope"',
             lambda f: _flat_get(f, "model.position_embedding_type", "rope") == "rope"),
    "rope_scaling": ("model.rope_scaling = true", lambda f: _flat_get(f, "model.rope_scaling") is True),
    "moe": ("model.num_experts is set", lambda f: _flat_get(f, "model.num_experts") is not None),
    "dense": ("model.num_experts is not set", lambda f: _flat_get(f, "model.num_experts") is None),
    "fp8": ("train.precision is an fp8 precision", lambda f: str(_flat_get(f, "train.precision", "")).startswith("fp8")),
    "bf16_params": ("train.precision is bf16 or an fp8 precision",
                    lambda f: _flat_get(f, "train.precision", "bf16") in BF16_PARAMS),
    "full_recompute": ('train.recompute_granularity = "full"',
                       lambda f: _flat_get(f, "train.recompute_granularity") == "full"),
    "pipelined": ("parallel.pipeline > 1", lambda f: (_flat_get(f, "parallel.pipeline") or 1) > 1),
}


def matters(row: Row, flat: Mapping[str, Any]) -> bool:
    return row.when is None or WHEN[row.when][1](flat)


def _r(key: str, kind: Kind, args: str | tuple[str, ...], absent: Any, doc: str, note: str = "",
       when: str | None = None) -> Row:
    return Row(key=key, kind=kind, args=(args,) if isinstance(args, str) else args, absent=absent, doc=doc,
               note=note, when=when)


_SMOKE = "the smoke stage is mcx's own short run before the full one"
_INIT = "the source's identity is part of the run ID (docs/lineage.md)"
_TRACK = "mcx records runs to MLflow and DVC"
_EVAL = "evaluation is mcx's (lm-evaluation-harness on the run's weights); not part of the run ID"

FLAGS: tuple[Row, ...] = (
    # ---- top level
    _r("name", "mcx", (), NA, "Experiment name: MLflow experiment, run directory label, Slurm job name.",
       "the export writes it as `#SBATCH --job-name`"),
    _r("description", "mcx", (), NA, "Free text recorded with the run.", "a comment in exported scripts"),
    # ---- model
    _r("model.preset", "mcx", (), NA, "Published model shape from mcx/spec/presets.py; keys the spec sets win.",
       "the export writes the preset's keys as their flags; the import names a preset when every one of its keys matches"),
    _r("model.num_layers", "value", "--num-layers", REQUIRED, "Transformer layers."),
    _r("model.hidden_size", "value", "--hidden-size", REQUIRED, "Hidden (model) dimension."),
    _r("model.num_attention_heads", "value", "--num-attention-heads", REQUIRED, "Attention heads (query heads)."),
    _r("model.num_query_groups", "rule", ("--group-query-attention", "--num-query-groups"), None,
       "Key/value head groups for grouped-query attention; unset means multi-head attention.",
       "both flags together; Megatron-LM ignores --num-query-groups without --group-query-attention"),
    _r("model.kv_channels", "value", "--kv-channels", None, "Per-head dimension; unset means hidden_size / num_attention_heads."),
    _r("model.vocab_size", "value", "--vocab-size", None, "Vocabulary size before padding; unset means the tokenizer's.",
       "Megatron-LM reads --vocab-size only for tokenizers without a vocabulary file (NullTokenizer)"),
    _r("model.make_vocab_size_divisible_by", "value", "--make-vocab-size-divisible-by", 128,
       "Pad the vocabulary (embedding rows) to a multiple of this (times parallel.tensor)."),
    _r("model.seq_length", "value", "--seq-length", REQUIRED, "Training sequence length in tokens."),
    _r("model.max_position_embeddings", "value", "--max-position-embeddings", REQUIRED,
       "Position table size; unset means seq_length.", "Megatron-LM requires it; the export writes seq_length when unset"),
    _r("model.normalization", "value", "--normalization", "LayerNorm", "Normalization layer."),
    _r("model.norm_epsilon", "value", "--norm-epsilon", 1e-5, "Epsilon of the normalization layers."),
    _r("model.swiglu", "switch", "--swiglu", False, "SwiGLU MLP (gated SiLU); false means a GeLU MLP."),
    _r("model.ffn_hidden_size", "value", "--ffn-hidden-size", DERIVED, "MLP hidden dimension; unset means 4 x hidden_size.",
       "absent in a script: 4 x hidden_size, or int(8 x hidden_size / 3 / 64) x 64 with --swiglu (Megatron-LM's rule, "
       "written into the spec); the export always writes the value when model.swiglu is true"),
    _r("model.position_embedding_type", "rule",
       ("--position-embedding-type", "--use-rotary-position-embeddings", "--no-position-embedding"),
       "learned_absolute", "Position embedding: rotary, learned absolute, or none.",
       "--use-rotary-position-embeddings (deprecated) imports as \"rope\"; --no-position-embedding is accepted with rope only"),
    _r("model.rotary_base", "value", "--rotary-base", 10000, "RoPE base (theta).", when="rope"),
    _r("model.rotary_percent", "value", "--rotary-percent", 1.0, "Fraction of each head's dimensions that RoPE rotates.",
       when="rope"),
    _r("model.rope_scaling", "switch", "--use-rope-scaling", False,
       "LLaMA 3.x RoPE scaling: low frequencies divided by model.rope_scaling_factor (low/high frequency factors 1 "
       "and 4, original context 8192, as Megatron-Core implements it).", when="rope"),
    _r("model.rope_scaling_factor", "value", "--rope-scaling-factor", 8.0,
       "LLaMA 3.x RoPE scaling factor (8 for LLaMA 3.1 and 3.3, 32 for 3.2), with model.rope_scaling.",
       when="rope_scaling"),
    _r("model.untie_embeddings_and_output_weights", "switch", "--untie-embeddings-and-output-weights", False,
       "Separate output projection instead of reusing the input embedding."),
    _r("model.add_bias_linear", "negated", "--disable-bias-linear", True, "Biases in all linear layers."),
    _r("model.add_qkv_bias", "switch", "--add-qkv-bias", False, "Bias in the QKV projection only (Qwen style)."),
    _r("model.init_method_std", "value", "--init-method-std", 0.02, "Standard deviation of the weight initialisation."),
    _r("model.hidden_dropout", "value", "--hidden-dropout", 0.1, "Dropout after attention and MLP."),
    _r("model.attention_dropout", "value", "--attention-dropout", 0.1, "Dropout on attention probabilities."),
    _r("model.transformer_impl", "rule", "--transformer-impl", "auto",
       "Layer implementation: Transformer Engine, Megatron-Core's local layers, or auto (Transformer Engine when it is installed).",
       "absent in a script imports as \"auto\" (Megatron-LM's default is transformer_engine, which auto picks wherever "
       "Transformer Engine exists); the export leaves \"auto\" out"),
    _r("model.num_experts", "value", "--num-experts", None, "Experts per MoE layer; unset means a dense model."),
    _r("model.moe_router_topk", "value", "--moe-router-topk", 2, "Experts each token is routed to.", when="moe"),
    _r("model.moe_router_load_balancing_type", "value", "--moe-router-load-balancing-type", "aux_loss",
       "Router load balancing.", when="moe"),
    _r("model.moe_aux_loss_coeff", "value", "--moe-aux-loss-coeff", 0.0, "Weight of the load-balancing loss.", when="moe"),
    _r("model.moe_ffn_hidden_size", "value", "--moe-ffn-hidden-size", None,
       "Expert MLP hidden dimension; unset means ffn_hidden_size.", when="moe"),
    _r("model.moe_token_dispatcher_type", "value", "--moe-token-dispatcher-type", "allgather",
       "How tokens reach their experts across expert-parallel ranks.", when="moe"),
    _r("model.moe_grouped_gemm", "switch", "--moe-grouped-gemm", False, "Run a rank's experts as one grouped GEMM.",
       when="moe"),
    # ---- parallel
    _r("parallel.tensor", "value", "--tensor-model-parallel-size", 1,
       "Tensor-parallel degree; unset lets the planner choose.", "the export takes the planned layout's degree"),
    _r("parallel.pipeline", "value", "--pipeline-model-parallel-size", 1,
       "Pipeline-parallel degree; unset lets the planner choose.", "the export takes the planned layout's degree"),
    _r("parallel.virtual_pipeline", "rule",
       ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"), 1,
       "Virtual (interleaved) pipeline stages per pipeline rank; 1 means no interleaving; unset lets the planner choose.",
       "--num-virtual-stages-per-pipeline-rank V imports as V; --num-layers-per-virtual-pipeline-stage L as "
       "num_layers / pipeline / L; the export writes --num-layers-per-virtual-pipeline-stage", when="pipelined"),
    _r("parallel.context", "value", "--context-parallel-size", 1,
       "Context-parallel degree (sequence split across GPUs); unset lets the planner choose."),
    _r("parallel.expert", "value", "--expert-model-parallel-size", 1,
       "Expert-parallel degree; unset lets the planner choose.", when="moe"),
    _r("parallel.sequence_parallel", "switch", "--sequence-parallel", False,
       "Shard norm and dropout activations across the tensor-parallel group."),
    _r("parallel.distributed_optimizer", "switch", "--use-distributed-optimizer", False,
       "Shard optimizer state across data-parallel ranks (ZeRO-1)."),
    _r("parallel.overlap_grad_reduce", "switch", "--overlap-grad-reduce", False,
       "Overlap the gradient reduce-scatter/all-reduce with the backward pass."),
    _r("parallel.overlap_param_gather", "switch", "--overlap-param-gather", False,
       "Overlap the distributed optimizer's parameter all-gather with the forward pass.",
       "absent in a script: false, with or without --use-distributed-optimizer (Megatron-LM overlaps the gather only "
       "when asked, and refuses to without the distributed optimizer and --overlap-grad-reduce)"),
    # ---- train
    _r("train.micro_batch_size", "value", "--micro-batch-size", REQUIRED, "Sequences per GPU per forward pass."),
    _r("train.global_batch_size", "value", "--global-batch-size", DERIVED, "Sequences per optimizer step.",
       "absent in a script: micro_batch_size x data-parallel size, as Megatron-LM computes it"),
    _r("train.train_iters", "rule", ("--train-iters", "--train-samples"), REQUIRED, "Optimizer steps of the full stage.",
       "--train-samples S imports as S / global_batch_size when that divides"),
    _r("train.lr", "value", "--lr", REQUIRED, "Peak learning rate."),
    _r("train.min_lr", "value", "--min-lr", 0.0, "Learning rate at the end of the decay."),
    _r("train.lr_decay_style", "value", "--lr-decay-style", "linear", "Learning-rate decay shape."),
    _r("train.lr_warmup_iters", "rule", ("--lr-warmup-iters", "--lr-warmup-fraction", "--lr-warmup-samples"), 0,
       "Linear warmup steps.", "--lr-warmup-fraction F imports as F x the decay length; --lr-warmup-samples S as "
       "S / global_batch_size; both only when the result is a whole number"),
    _r("train.lr_decay_iters", "rule", ("--lr-decay-iters", "--lr-decay-samples"), None,
       "Steps over which the learning rate decays; unset means train_iters.",
       "--lr-decay-samples S imports as S / global_batch_size when that divides"),
    _r("train.weight_decay", "value", "--weight-decay", 0.01, "Decoupled (AdamW) weight decay."),
    _r("train.clip_grad", "value", "--clip-grad", 1.0, "Gradient-norm clipping threshold."),
    _r("train.adam_beta1", "value", "--adam-beta1", 0.9, "Adam beta1."),
    _r("train.adam_beta2", "value", "--adam-beta2", 0.999, "Adam beta2."),
    _r("train.adam_eps", "value", "--adam-eps", 1e-8, "Adam epsilon."),
    _r("train.precision", "rule", ("--bf16", "--fp16", "--fp8-format"), "fp32",
       "Parameter/compute precision; the fp8 precisions run Transformer Engine fp8 GEMMs with bf16 parameters.",
       "bf16: --bf16; fp16: --fp16; fp32: neither; fp8-hybrid: --bf16 --fp8-format hybrid; fp8-e4m3: --bf16 --fp8-format e4m3"),
    _r("train.fp8_recipe", "value", "--fp8-recipe", "delayed", "FP8 scaling recipe.", when="fp8"),
    _r("train.fp8_amax_history_len", "value", "--fp8-amax-history-len", 1, "Amax history window of delayed scaling.",
       when="fp8"),
    _r("train.fp8_amax_compute_algo", "value", "--fp8-amax-compute-algo", "most_recent",
       "How delayed scaling picks the amax from its history.", when="fp8"),
    _r("train.fp8_attention", "mcx", (), NA,
       "Attention (Transformer Engine's fused attention on cuDNN) in FP8 as well as the GEMMs.",
       "TransformerConfig.fp8_dot_product_attention, which Megatron-LM 0.19.2 sets from no flag; not exported",
       when="fp8"),
    _r("train.te_op_fuser", "switch", "--use-transformer-engine-op-fuser", False,
       "Each dense MLP as one Transformer Engine op sequence: SwiGLU fused with the FP8 casts around it.",
       "mcx checkpoints the fused ops' FP8 scaling state (D29)", when="dense"),
    _r("train.grad_reduce_in_bf16", "switch", "--grad-reduce-in-bf16", False, "Reduce gradients in bf16 instead of fp32."),
    _r("train.gradient_accumulation_fusion", "negated", "--no-gradient-accumulation-fusion", True,
       "On GPUs, accumulate weight gradients into the fp32 gradient buffer inside the GEMM.",
       "mcx runs it on cuBLAS where apex is absent; Megatron-LM turns it off without apex"),
    _r("train.cross_entropy_fusion", "switch", "--cross-entropy-loss-fusion", False,
       "On GPUs with bf16 parameters, Megatron's fused cross entropy (off in deterministic mode).",
       "exports as --cross-entropy-loss-fusion with Megatron-LM's native implementation", when="bf16_params"),
    _r("train.rope_fusion", "negated", "--no-rope-fusion", True,
       "On GPUs, fused rotary embeddings: Transformer Engine's kernel, or MCore's RoPE torch.compile'd on the local spec.",
       "Megatron-LM fuses RoPE with Transformer Engine only", when="rope"),
    _r("train.expandable_segments", "mcx", (), NA,
       "On GPUs, torch's expandable-segments allocator: less memory lost to fragments near the GPU's capacity.",
       f"an environment setting, not a flag: the script export writes `export {ALLOCATOR_ENV}={ALLOCATOR_VALUE}`, "
       "the import reads the variable where the script launches"),
    _r("train.cuda_graphs", "rule", ("--cuda-graph-impl", "--cuda-graph-scope"), False,
       "One GPU: each step's forward and backward captured once as one CUDA graph and replayed (no per-layer host "
       "time).",
       "--cuda-graph-impl full_iteration (or its older spelling --cuda-graph-scope full_iteration); Megatron-LM's "
       "per-layer graphs (local, transformer_engine) are not run, and the importer keeps false for them (D75)"),
    _r("train.recompute_granularity", "rule", ("--recompute-granularity", "--recompute-activations"), "none",
       "Activation recomputation: none, selective (attention core) or full (whole layers).",
       "\"none\" is the flag's absence; --recompute-activations (deprecated) imports as \"selective\""),
    _r("train.recompute_method", "value", "--recompute-method", UNMATCHED, "How full recomputation picks layers.",
       "Megatron-LM refuses full recomputation without it", when="full_recompute"),
    _r("train.recompute_num_layers", "value", "--recompute-num-layers", UNMATCHED,
       "Layers per recompute unit (uniform) or recomputed layers per stage (block).",
       "Megatron-LM refuses full recomputation without it", when="full_recompute"),
    _r("train.seed", "value", "--seed", 1234, "Random seed (initialisation, data order, dropout)."),
    _r("train.deterministic", "switch", "--deterministic-mode", False,
       "Deterministic kernels and NCCL algorithms: bitwise-reproducible runs."),
    _r("train.eval_interval", "value", "--eval-interval", UNMATCHED, "Validate every this many steps.",
       "absent in a script, Megatron-LM validates only after training; the import keeps mcx's default and says so"),
    _r("train.eval_iters", "value", "--eval-iters", 100, "Validation batches per evaluation."),
    _r("train.log_interval", "value", "--log-interval", 100, "Record training metrics every this many steps."),
    _r("train.loss_spike_factor", "mcx", (), NA, "Stop as diverged when the loss exceeds this multiple of its recent mean.",
       "mcx's divergence guard; Megatron-LM's --check-for-spiky-loss is a rerun check with a fixed threshold"),
    _r("train.loss_spike_window", "mcx", (), NA, "Steps in the recent mean of the divergence guard.",
       "mcx's divergence guard"),
    # ---- data
    _r("data.path", "rule", "--data-path", REQUIRED, "Prepared dataset directory (DVC-tracked), relative to the project; "
       "or data.mix.", "--data-path DIR/PREFIX imports as path = DIR, prefix = PREFIX; a weighted --data-path as data.mix"),
    _r("data.prefix", "rule", "--data-path", NA, "Dataset file prefix: <path>/<prefix>.bin and .idx.",
       "the last part of --data-path"),
    _r("data.split", "value", "--split", "969,30,1", "Train, validation and test weights.",
       "imported as Megatron-LM reads it: the numbers in the text, 0 for missing weights ('99,1' -> 99,1,0)"),
    _r("data.tokenizer.kind", "rule", "--tokenizer-type", REQUIRED,
       "Tokenizer: bpe (trained on the corpus by mcx data prepare), huggingface, sentencepiece or gpt2.",
       "GPT2BPETokenizer <-> gpt2; HuggingFaceTokenizer <-> huggingface; GPTSentencePieceTokenizer, "
       "SentencePieceTokenizer and Llama2Tokenizer -> sentencepiece (exported as GPTSentencePieceTokenizer); "
       "bpe exports as HuggingFaceTokenizer with <data.path>/tokenizer.json"),
    _r("data.tokenizer.path", "rule", ("--tokenizer-model", "--vocab-file"), None,
       "tokenizer.json, a SentencePiece model, or a GPT-2 vocab.json.",
       "--vocab-file for gpt2, --tokenizer-model otherwise"),
    _r("data.tokenizer.merges", "rule", "--merge-file", None, "GPT-2 merges.txt."),
    _r("data.tokenizer.vocab_size", "mcx", (), NA, "Vocabulary size of the BPE tokenizer mcx trains (kind = \"bpe\").",
       "Megatron-LM does not train tokenizers"),
    _r("data.mix", "rule", ("--data-path", "--data-args-path", "--train-data-path", "--per-split-data-args-path"), NA,
       "A mixture: [data.mix.NAME] tables of path, prefix (default \"corpus\") and weight (relative).",
       "weighted --data-path W1 P1 W2 P2 (or --data-args-path); with [data.valid] or [data.test], "
       "--train-data-path (or the train list of --per-split-data-args-path). Imported components are named after "
       "their prefix (its directory for mcx's \"corpus\")"),
    _r("data.valid", "rule", "--valid-data-path", NA, "The validation split's own mixture (tables as [data.mix]).",
       "with it, each split reads its own mixture whole and data.split is not used (nor exported)"),
    _r("data.test", "rule", "--test-data-path", NA, "The test split's own mixture (tables as [data.mix]).",
       "as data.valid"),
    # ---- checkpoint
    _r("checkpoint.dir", "rule", ("--save", "--load"), None, "Checkpoint directory; unset means <run dir>/checkpoints.",
       "--save and --load must name the same directory; the export writes both, unset as checkpoints/<name> "
       "(the script's $CHECKPOINT_DIR when set)"),
    _r("checkpoint.interval", "rule", "--save-interval", 0, "Save every this many steps; 0 saves only at the end of a stage.",
       "--save-interval >= train_iters imports as 0; the export writes train_iters for 0 (Megatron-LM requires the "
       "flag with --save)"),
    _r("checkpoint.final", "mcx", (), NA, "Save a checkpoint when the stage ends; false saves only every "
       "checkpoint.interval steps and on preemption (for models whose checkpoint outweighs a short run).",
       "Megatron-LM always saves after the last iteration when --save is given"),
    _r("checkpoint.async_save", "rule", ("--async-save", "--use-persistent-ckpt-worker"), False,
       "Write checkpoints in the background.",
       "megatron-core 0.19 honours --async-save only with --use-persistent-ckpt-worker; the export writes both"),
    _r("checkpoint.keep", "mcx", (), NA, "Checkpoints kept per stage (older ones are deleted).",
       "Megatron-LM keeps every checkpoint"),
    _r("checkpoint.track_intermediate", "mcx", (), NA, "Add intermediate checkpoints to DVC too, not only the last.", _TRACK),
    # ---- smoke
    _r("smoke.enabled", "mcx", (), NA, "Run the smoke stage before the full stage.", _SMOKE),
    _r("smoke.num_layers", "mcx", (), NA, "Layers of the smoke model.", _SMOKE),
    _r("smoke.hidden_size", "mcx", (), NA, "Hidden size of the smoke model; unset means min(model.hidden_size, 256).", _SMOKE),
    _r("smoke.ffn_hidden_size", "mcx", (), NA, "MLP size of the smoke model; unset scales with hidden_size.", _SMOKE),
    _r("smoke.num_attention_heads", "mcx", (), NA, "Heads of the smoke model; unset fits hidden_size and the layout.", _SMOKE),
    _r("smoke.seq_length", "mcx", (), NA, "Sequence length of the smoke stage; unset means min(model.seq_length, 256).", _SMOKE),
    _r("smoke.num_experts", "mcx", (), NA, "Experts of the smoke model; unset means min(model.num_experts, 4).", _SMOKE),
    _r("smoke.train_iters", "mcx", (), NA, "Steps of the smoke stage.", _SMOKE),
    _r("smoke.global_batch_size", "mcx", (), NA, "Global batch of the smoke stage; unset means the smallest valid for the layout.", _SMOKE),
    _r("smoke.lr", "mcx", (), NA, "Peak learning rate of the smoke stage; unset means train.lr.", _SMOKE),
    _r("smoke.data_fraction", "mcx", (), NA, "Fraction of the dataset the smoke stage reads.", _SMOKE),
    _r("smoke.resume_check_iters", "mcx", (), NA, "Steps trained after a checkpoint reload to check resumption.", _SMOKE),
    _r("smoke.loss_window", "mcx", (), NA, "Steps per window in the loss-decrease check.", _SMOKE),
    _r("smoke.min_loss_drop", "mcx", (), NA, "Required drop of the last window's mean loss below the first window's.", _SMOKE),
    _r("smoke.nodes", "mcx", (), NA, "Nodes of the smoke stage; unset means one (the parallel degrees shrink to fit it).", _SMOKE),
    _r("smoke.gpus_per_node", "mcx", (), NA, "GPUs per node of the smoke stage; unset means hardware.gpus_per_node.", _SMOKE),
    _r("smoke.time_limit", "mcx", (), NA, "Slurm time limit of the smoke stage's job; unset means the plan's estimate "
       "(start-up plus the smoke steps at the predicted step time, with margin), never above launch.slurm.time.", _SMOKE),
    _r("smoke.gpu", "mcx", (), NA, "GPU model of the smoke stage; unset means hardware.gpu; \"cpu\" runs it as CPU processes "
       "(data parallel, fp32), e.g. on a cluster without GPUs.", _SMOKE),
    _r("smoke.tensor", "mcx", (), NA, "Tensor-parallel degree of the smoke stage; unset follows the full stage, shrunk to fit.", _SMOKE),
    _r("smoke.pipeline", "mcx", (), NA, "Pipeline-parallel degree of the smoke stage; unset follows the full stage, shrunk to fit.", _SMOKE),
    _r("smoke.context", "mcx", (), NA, "Context-parallel degree of the smoke stage; unset follows the full stage, shrunk to fit.", _SMOKE),
    _r("smoke.expert", "mcx", (), NA, "Expert-parallel degree of the smoke stage; unset follows the full stage, shrunk to fit.", _SMOKE),
    # ---- hardware
    _r("hardware.nodes", "launcher", ("torchrun --nnodes", "#SBATCH --nodes"), 1, "Nodes of the full stage."),
    _r("hardware.gpus_per_node", "launcher", ("torchrun --nproc_per_node", "#SBATCH --gpus-per-node"), 1,
       "GPUs (worker processes) per node.", "srun without torchrun: #SBATCH --ntasks-per-node"),
    _r("hardware.gpu", "mcx", (), NA, "GPU model, for the planner's memory, FLOPs and cost figures.",
       "Megatron-LM does not need it; an exported script carries it as a `# mcx:` line, other scripts import "
       "as \"any\""),
    # ---- launch
    _r("launch.kind", "launcher", ("torchrun", "srun / #SBATCH"), NA, "How the worker starts: in-process, torchrun, or Slurm.",
       "a script with #SBATCH lines or srun imports as slurm; torchrun or python -m torch.distributed.run as torchrun; "
       "plain python as local"),
    _r("launch.master_port", "launcher", "torchrun --master_port", NA, "Rendezvous port; unset picks a free port.",
       "also the port of --rdzv_endpoint"),
    _r("launch.slurm.partition", "launcher", "#SBATCH --partition", NA, "Slurm partition."),
    _r("launch.slurm.account", "launcher", "#SBATCH --account", NA, "Slurm account."),
    _r("launch.slurm.time", "launcher", "#SBATCH --time", NA, "Wall-clock limit per job."),
    _r("launch.slurm.qos", "launcher", "#SBATCH --qos", NA, "Slurm quality of service."),
    _r("launch.slurm.constraint", "launcher", "#SBATCH --constraint", NA, "Slurm node feature constraint."),
    _r("launch.slurm.signal_grace_seconds", "launcher", "#SBATCH --signal", NA,
       "Seconds before the time limit at which Slurm signals the job to checkpoint and requeue.",
       "--signal=[B:]SIG@SECONDS; the export adds --exit-signal-handler"),
    _r("launch.slurm.requeue", "launcher", ("#SBATCH --requeue", "#SBATCH --no-requeue"), NA,
       "Requeue the job after preemption or a timeout."),
    _r("launch.slurm.extra_sbatch", "launcher", "#SBATCH (others)", NA, "Further #SBATCH options, verbatim.",
       "every #SBATCH option the other keys do not cover"),
    _r("launch.container.image", "launcher", ("srun --container-image", "podman run IMAGE"), NA,
       "The image the worker runs in: a squashfs file (pyxis, Slurm), a local Podman image (local, torchrun) or "
       "name@sha256:<digest>; its content is in the run ID (D67). Unset: the host's environment.",
       "pyxis on Slurm, Podman for local and torchrun launches"),
    _r("launch.container.mounts", "launcher", ("srun --container-mounts", "podman run --volume"), NA,
       "Further mounts, \"HOST:CONTAINER[:ro]\"; the project, the job's data and init source, and the Python "
       "environment are mounted at their own paths already."),
    _r("launch.container.workdir", "launcher", ("srun --container-workdir", "podman run --workdir"), NA,
       "Working directory inside the container; unset means the stage directory."),
    _r("launch.container.env", "launcher", ("srun --container-env", "podman run --env"), NA,
       "Names of host variables the worker sees inside the container, with their host values."),
    _r("launch.container.python", "mcx", (), NA,
       "The interpreter inside the image; unset means this interpreter's path (the image holds it, or it is "
       "mounted with its environment).",
       "no launcher option: srun and podman start the command they are given, this interpreter first"),
    _r("launch.watchdog.enabled", "mcx", (), NA,
       "A watchdog beside each node's torchrun agent (launch.kind torchrun or slurm) ends a hung stage, with every "
       "rank's Python stacks in hangs/, and restarts it from its newest checkpoint (docs/runs.md, Hangs).",
       "Megatron-LM's --exit-duration-in-mins and NCCL timeouts end a job; they neither dump stacks nor restart it"),
    _r("launch.watchdog.max_restarts", "mcx", (), NA,
       "Hangs after which the stage is restarted; one more ends it failed, its stacks kept.", "the watchdog's"),
    _r("launch.watchdog.step_factor", "mcx", (), NA,
       "No finished step for this many times the step time (the largest of the ranks' recent steps, or the plan's "
       "prediction) is a hang.", "the watchdog's"),
    _r("launch.watchdog.min_seconds", "mcx", (), NA,
       "The least time without a step that counts as a hang: it must cover a checkpoint save and an evaluation.",
       "the watchdog's"),
    _r("launch.watchdog.startup_seconds", "mcx", (), NA,
       "The bound before an attempt's first step: imports, model, data and loading the checkpoint.", "the watchdog's"),
    # ---- init
    _r("init.from", "mcx", (), NA, "Where the weights start: \"run:<run-id>\" (that run's final checkpoint, or "
       "init.step's), \"hf:<dir>\" (a Hugging Face model directory) or \"megatron:<dir>\" (a Megatron-Core "
       "checkpoint); unset means random initialisation.", _INIT),
    _r("init.step", "mcx", (), NA, "For a run: source, the step whose checkpoint to start from; unset means the "
       "run's final checkpoint.", _INIT),
    _r("init.load_optimizer", "mcx", (), NA, "Also load the source's optimizer state (run: and megatron: sources).",
       "Megatron-LM loads it unless --no-load-optim; " + _INIT),
    _r("init.reset_step", "mcx", (), NA, "Count steps, the learning-rate schedule and the data from 0; false "
       "continues from the source's step.", "Megatron-LM's --finetune resets the iteration; " + _INIT),
    # ---- tracking, baseline, budget
    _r("tracking.uri", "mcx", (), NA, "MLflow tracking URI; unset means $MLFLOW_TRACKING_URI, else the embedded store.", _TRACK),
    _r("tracking.experiment", "mcx", (), NA, "MLflow experiment; unset means the spec's name.", _TRACK),
    _r("tracking.dvc_remote", "mcx", (), NA, "DVC remote for checkpoints and data; unset means the project's default DVC remote, else the embedded local one.", _TRACK),
    _r("tracking.log_checkpoints", "mcx", (), NA, "Record checkpoints as DVC-tracked artifacts.", _TRACK),
    _r("tracking.system_metrics_interval_s", "mcx", (), NA,
       "Seconds between GPU and host samples on every node (system/* metrics in MLflow); 0 turns them off.", _TRACK),
    _r("baseline.run", "mcx", (), NA, "Run ID or named baseline this run is compared against.",
       "regression gates are mcx's"),
    _r("baseline.tolerances", "mcx", (), NA, "Metric -> allowed relative increase over the baseline.",
       "regression gates are mcx's"),
    _r("budget.max_gpu_hours", "mcx", (), NA, "Refuse plans above this many GPU-hours without confirmation.",
       "budgets are mcx's"),
    _r("budget.assumed_mfu", "mcx", (), NA, "An MFU for the time and cost estimates in place of the step-time model's (unset: the model).",
       "budgets are mcx's"),
    _r("budget.gpu_hour_price", "mcx", (), NA, "Price per GPU-hour for the cost line.", "budgets are mcx's"),
    # ---- sweep
    _r("sweep", "mcx", (), NA, "Many runs as one experiment (`mcx sweep`): method (grid, random, tpe), parameters "
       "(spec key -> values or a range), objective, direction, max_trials, parallel, seed, prune, "
       "prune_startup_trials, prune_warmup_evals, name (docs/sweeps.md). Unset: not a sweep.",
       "sweeps are mcx's; each trial is the spec with its values and no [sweep], not part of any run's ID"),
    # ---- eval (downstream evaluation, D68)
    _r("eval.tasks", "mcx", (), NA, "lm-evaluation-harness tasks run on the run's weights after its full stage: "
       "registry names (read from a local datasets cache) or task directories (YAML and local data, relative to "
       "the project), e.g. `[\"evals/quickstart_next_line\"]`. Empty: no evaluation.", _EVAL),
    _r("eval.num_fewshot", "mcx", (), NA, "Examples put before each item.", _EVAL),
    _r("eval.limit", "mcx", (), NA, "Items per task (the first N); unset: every item.", _EVAL),
    _r("eval.every", "mcx", (), NA, "Also evaluate the full stage's checkpoints at every multiple of N steps "
       "(each saved and kept for it), after the stage; scores logged at their step (D71). Unset or 0: only the "
       "final weights.", _EVAL),
    _r("eval.batch_size", "mcx", (), NA, "Requests per forward pass of the model.", _EVAL),
    _r("eval.model", "mcx", (), NA, "The harness's model: `\"megatron\"`, its model interface over the run's own "
       "Megatron-Core model (no export; greedy generation without a KV cache), or `\"hf\"`, its Hugging Face "
       "model on an export of the run (`eval-hf` in the run directory). The same scores either way (D72); "
       "`mcx eval hf:DIR` is always `\"hf\"`.", _EVAL),
    # ---- debug (fault injection)
    _r("debug.perturb_params", "mcx", (), NA, "Fault injection: `{step = N, amount = 1e-2}` adds amount to every "
       "floating-point model weight just before step N of each stage that reaches it, so the run departs there "
       "(`mcx reproduce RUN --set debug.perturb_params.step=N` tests the verdict). Unset: off.",
       "fault injection is mcx's; part of the run ID when set"),
    _r("debug.nan_params_at_step", "mcx", (), NA, "Fault injection: every floating-point model weight becomes NaN "
       "just before this step, so the divergence guard stops the stage there. Unset: off.",
       "fault injection is mcx's; part of the run ID when set"),
    _r("debug.perturb_output", "mcx", (), NA, "Fault injection: `{step = N, micro_batch = M, module = "
       "\"decoder.layers.1.mlp.linear_fc2\", amount = 1e-2}` adds amount to that module's forward output in "
       "micro-batch M (0-based) of step N on every rank, so `mcx locate` must name that operation "
       "(docs/reproduce.md). A module the model does not have stops the stage before its first step, naming "
       "those it has. Unset: off.", "fault injection is mcx's; part of the run ID when set"),
    _r("debug.swap_micro_batches_at_step", "mcx", (), NA, "Fault injection: micro-batches 0 and 1 of this step "
       "trade places on every data-parallel rank (the same samples, another order), so the batch hashes of "
       "`mcx reproduce RUN --set debug.swap_micro_batches_at_step=N` differ first at step N, micro-batch 0. "
       "Needs at least two micro-batches a step. Unset: off.",
       "fault injection is mcx's; part of the run ID when set"),
)

BY_KEY: dict[str, Row] = {row.key: row for row in FLAGS}

# pretrain_gpt.py argument -> the row that owns it (value, switch and negated rows; rules name theirs).
BY_ARG: dict[str, Row] = {arg: row for row in FLAGS if row.kind in ("value", "switch", "negated", "rule")
                          for arg in row.args}
