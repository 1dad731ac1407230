"""What a model costs before it runs, from its config alone: the parameter count, the memory of
one training step (`training_footprint`, `classifier_training_footprint`), of an evaluation
(`evaluation_footprint`, `classifier_evaluation_bytes`) and the sizes a generation or a served
request allocates (`key_value_memory_row_bytes`, `attention_score_bytes`, `most_that_fit`).

Nothing is built or allocated, so the tools print their plans and refuse a size that cannot fit
before the first step; the memory benchmark (`benchmarks/memory_bench.py`) compares the same
numbers with the peak RSS of real steps. Imports nothing that loads TensorFlow.

Shape glossary: b per-replica batch, L layers, T segment length, M memory length, K = M + T keys,
D model size, N heads, H head size, F d_inner, V vocabulary, S shortlist (cutoffs[0], or V),
C tail clusters, P parameters.

One training step of one replica holds (`training_footprint`):

* weights: 4 B per parameter (variables stay float32 under a mixed policy); a mixed policy adds
  the compute-dtype copy of every weight that the layers cast and the backward pass keeps;
* gradients: 4 B per parameter (the variables' dtype, dense: the trainer densifies them);
* optimizer: its slots, 4 B per parameter each (Adam, AdamW and LAMB keep two);
* gradient copies: on TensorFlow the clipped gradients exist beside the gradients (4 B per
  parameter); JAX's compiled step clips and updates the donated buffers in place (none);
* memory state: the training memory [b, L, M, D] in the compute dtype, twice (the variable and the
  new memory the step computes before it is assigned);
* activations: what the backward pass keeps, per layer (`activation_bytes`), plus the softmax,
  the tensors of width D and F scaled by what was measured beyond them (`StepCosts`);
* evaluation memory, when the run evaluates: the evaluator's key/value memory [b, L, N, H, M'] x 2
  and position keys [L, N, H, K' + 1] (M', K' the evaluation settings), kept between passes;
* the step's program: TensorFlow's traced graph, or XLA's executable and the compiler's working
  memory; measured, a constant and a share per layer (`STEP_COSTS`);
* a margin, MARGIN of the rest: the spread of the measurements the constants were read from.

What the process holds before the step (the libraries) is not in it: the plan measures it
(`resident_bytes`) and adds it, with RUN_BYTES for the run's own (the input pipeline, the
checkpoints). Where JAX reports what its compiled step uses
(`compiled_bytes` of `memory_analysis()`), that replaces the weights-to-activations items
(`Footprint.compiled`).

The paper's baselines (`config.architecture`: "transformer", "lstm") are estimated with the same
items, roughly: their parameters are counted exactly; the vanilla Transformer's activations are
Transformer-XL's without a memory (M = 0) and its training memory none; the LSTM's activations
are what its scan keeps per token and layer (`lstm_activation_bytes`) and its memory the state
[b, L, D] x 2. Their evaluation state is the token window or the state (`evaluation_memory_bytes`).
Neither was measured against real steps: the plan's ratio bounds (LOWEST_RATIO) are
Transformer-XL's.
"""

import dataclasses

FLOAT32 = 4
MIB = 2**20
# How many float32 slots each optimizer of tfxl-train keeps per parameter.
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2, "lamb": 2}
# The share of the tokens whose target falls into the tail clusters of an adaptive softmax, all
# counted against the largest tail cluster (a cluster's logits exist only for its own tokens).
# Cutoffs are chosen so that the shortlist covers most tokens: wt103's 20,000 shortlist covers
# about 90% of its tokens; 0.2 leaves a margin.
TAIL_TOKEN_SHARE = 0.2
# The estimate's margin over what it counts, a share of the step's items.
MARGIN = 0.1
# Measured peak RSS / (runtime + estimate) stays within [LOWEST_RATIO, 1] on the configurations
# of tests/test_plan.py and BENCHMARKS.md ("The memory estimate of tfxl-train's plan").
LOWEST_RATIO = 0.75
# What a training run holds once per process beyond its steps and the runtime resident when
# the plan is made: the input pipeline's buffers, the checkpoint writer, the summaries. Measured:
# tfxl-train's peak RSS exceeded runtime + step by 20-40 MiB more than the benchmark's steps.
RUN_BYTES = 64 * MIB
# What a process holds besides the buffers of JAX's compiled step (memory_analysis): the
# variables' arrays outside it, the batches on the host; measured 0-25% of those buffers.
COMPILED_FACTOR = 1.25


@dataclasses.dataclass(frozen=True)
class StepCosts:
    """What one backend's training step holds beyond the tensors this module counts, measured
    on CPU by benchmarks/memory_bench.py (peak RSS of a fresh process less its idle baseline,
    over shapes ruled by parameters, by width and by depth; BENCHMARKS.md) and rounded up.

    program, per_layer: the step's graph or executable and what building it keeps (bytes, and
      bytes per layer: the program grows with the layers, not with the batch).
    mixed, mixed_per_layer: more of it under a mixed policy (XLA compiles the casts too).
    gradient_copies: gradient-sized temporaries at the update (4 B per parameter each).
    width_factor: the activations of width D and F ([b, K, D], [b, T, F], ...) against what the
      backward pass was counted to keep: the saved residuals, LayerNorm statistics and
      rel-shift's padded copies that the list leaves out.
    """

    name: str
    program: int
    per_layer: int
    mixed: int = 0
    mixed_per_layer: int = 0
    gradient_copies: int = 0
    width_factor: float = 1.0


STEP_COSTS = {
    ("tensorflow", False): StepCosts("TensorFlow graph", 64 * MIB, 16 * MIB, gradient_copies=1,
                                     width_factor=1.6),
    ("tensorflow", True): StepCosts("XLA", 224 * MIB, 30 * MIB, mixed_per_layer=12 * MIB,
                                    gradient_copies=1, width_factor=2.3),
    ("jax", True): StepCosts("XLA", 256 * MIB, 12 * MIB, mixed=40 * MIB,
                             mixed_per_layer=10 * MIB, width_factor=1.9),
}


def step_costs(backend="tensorflow", jit_compile=False):
    """The `StepCosts` of a step on `backend` ("tensorflow", "jax"; JAX's step is always
    compiled)."""
    if backend == "jax":
        return STEP_COSTS["jax", True]
    return STEP_COSTS["tensorflow", bool(jit_compile)]


def compiled_bytes(analysis):
    """The bytes a compiled XLA computation holds at its peak, from JAX's
    `jitted.lower(...).compile().memory_analysis()`: its arguments and outputs (less what the
    donated arguments alias) and its temporaries."""
    return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)


def compute_bytes(mixed_precision):
    """Bytes of one element in the compute dtype of a Keras dtype policy name."""
    return FLOAT32 if mixed_precision in (None, "float32") else 2


def _clusters(c):
    # Here, not at the top: tfxl.layers loads Keras, and the plan's module is imported by
    # --help, which loads no TensorFlow.
    from tfxl.layers.adaptive_clusters import cluster_layout
    return cluster_layout(c.vocab_size, c.cutoffs, c.embed_dim, c.d_model, c.div_val,
                          c.proj_same_dim)


def parameter_count(config):
    """The number of trainable parameters of the language model of `config` (`TransfoXLLM`, or
    a baseline's), counted from the config (the sum of its trainable variables' sizes, tested
    against a built model)."""
    c = config
    if c.architecture == "transformer_xl":
        return backbone_parameter_count(c) + _softmax_parameter_count(c)
    if c.architecture == "transformer":
        nh = c.n_head * c.d_head
        attention = 4 * c.d_model * nh + 2 * c.d_model  # W_q, W_k, W_v, W_o; LayerNorm
        feed_forward = 2 * c.d_model * c.d_inner + c.d_inner + c.d_model + 2 * c.d_model
        layers = c.n_layer * (attention + feed_forward)
    else:  # lstm: W_x [D, 4D], W_h [D, 4D], b [4D] per layer
        layers = c.n_layer * (8 * c.d_model * c.d_model + 4 * c.d_model)
    return _embedding_parameter_count(c) + layers + _softmax_parameter_count(c)


def _embedding_parameter_count(config):
    """The adaptive embedding's: one table [V, d_embed] when div_val == 1, else one per
    cluster, and the projections to D."""
    c = config
    clusters = _clusters(c)
    groups = clusters[:1] if c.div_val == 1 else clusters
    return sum((c.vocab_size if c.div_val == 1 else g.size) * g.dim
               + (g.dim * c.d_model if g.projected else 0) for g in groups)


def checkpoint_mirror_bytes(parameters, optimizer="adam"):
    """Host bytes of the TensorFlow variables a checkpoint is written from off TensorFlow: a
    float32 mirror of every weight and optimizer slot (tfxl/checkpoints/tree.py's
    `CheckpointTree`), made at the first save and kept, once per host."""
    return FLOAT32 * parameters * (1 + OPTIMIZER_SLOTS[optimizer])


def training_memory_row_bytes(config, mixed_precision="float32"):
    """Bytes of one row of the training memory carried from step to step: Transformer-XL's
    layer inputs [L, M, D], the LSTM's state [L, D] x 2, none for the vanilla Transformer."""
    c, e = config, compute_bytes(mixed_precision)
    if c.architecture == "transformer":
        return 0
    if c.architecture == "lstm":
        return 2 * e * c.n_layer * c.d_model
    return e * c.n_layer * c.mem_len * c.d_model


def context_text(config):
    """What a position of `config`'s model reads besides its segment, in a few words (the
    plan's first line)."""
    c = config
    if c.architecture == "transformer":
        return "transformer: a window of tgt_len, no memory"
    if c.architecture == "lstm":
        return "lstm: its state carried between segments"
    return f"mem_len {c.mem_len}"


def lstm_activation_bytes(config, batch, width_factor=1.0):
    """{"recurrent", "softmax": bytes} the LSTM's backward pass keeps for one [batch, T]
    segment: per layer and token, the input projection and the gates [4D], the state (h, c)
    the scan writes out [2D], tanh(c) and the layer's output with its dropout mask [3D]; and
    the softmax as Transformer-XL's."""
    c = config
    tokens = batch * c.tgt_len
    recurrent = width_factor * FLOAT32 * c.n_layer * tokens * 9 * c.d_model
    softmax = activation_bytes(c, batch, 0)["softmax"]
    return {"recurrent": int(recurrent), "softmax": softmax}


def backbone_parameter_count(config):
    """The trainable parameters of `TransfoXLBackbone(config)`: the adaptive embedding and the
    layers, without the language model's softmax."""
    c = config
    clusters = _clusters(c)
    # Adaptive embedding: one table [V, d_embed] when div_val == 1, else one per cluster.
    groups = clusters[:1] if c.div_val == 1 else clusters
    embedding = sum((c.vocab_size if c.div_val == 1 else g.size) * g.dim
                    + (g.dim * c.d_model if g.projected else 0) for g in groups)
    nh = c.n_head * c.d_head
    attention = 5 * c.d_model * nh + 2 * c.d_model  # W_q, W_k,E, W_v, W_k,R, W_o; LayerNorm
    feed_forward = 2 * c.d_model * c.d_inner + c.d_inner + c.d_model + 2 * c.d_model
    biases = 2 * (c.n_layer if c.untie_r else 1) * nh  # u and v
    return embedding + c.n_layer * (attention + feed_forward) + biases


def _softmax_parameter_count(config):
    """The adaptive softmax's own tables unless tied, own projections unless tied, one bias [V],
    and the tail clusters' logits in the head."""
    c = config
    clusters = _clusters(c)
    softmax = c.vocab_size
    for cluster, tied_projection in zip(clusters, c.cluster_tie_projs):
        if not c.tie_weight:
            softmax += cluster.size * cluster.dim
        if cluster.projected and not tied_projection:
            softmax += c.d_model * cluster.dim
    tails = len(clusters) - 1
    if tails:
        softmax += tails * clusters[0].dim + tails
    return softmax


def size_flag_shares(config):
    """[(field, share)]: the share of `parameter_count(config)` that grows with each of the
    config's size fields (each the tfxl-train flag of its name), largest first. The embedding
    and softmax tables grow with d_embed (d_model when it is unset) and the vocabulary (the
    data's, not a flag), the layers with n_layer, d_model and their own widths."""
    c = config
    nh = c.n_head * c.d_head
    attention = c.n_layer * (5 * c.d_model * nh + 2 * c.d_model) + 2 * (
        c.n_layer if c.untie_r else 1) * nh
    feed_forward = c.n_layer * (2 * c.d_model * c.d_inner + c.d_inner + 3 * c.d_model)
    total = parameter_count(c)
    tables = max(0, total - attention - feed_forward)
    grows = {"n_layer": attention + feed_forward, "d_model": attention + feed_forward,
             "n_head": attention, "d_head": attention, "d_inner": feed_forward,
             "d_embed" if c.d_embed is not None else "d_model": tables}
    if c.d_embed is None:
        grows["d_model"] = total
    return sorted(((name, part / max(1, total)) for name, part in grows.items()),
                  key=lambda item: -item[1])


def classifier_parameter_count(config, num_classes, pooling):
    """The trainable parameters of `DocumentClassifier(config, num_classes, pooling)`: the
    backbone, the head [D, C] + [C], and the segment attention's query [D] when it pools."""
    query = config.d_model if pooling == "segment_attention" else 0
    return backbone_parameter_count(config) + config.d_model * num_classes + num_classes + query


def activation_bytes(config, batch, mem_len=None, mixed_precision="float32", width_factor=1.0):
    """{"attention", "feed_forward", "softmax": bytes} the backward pass keeps for one
    [batch, T] segment over K = mem_len + T keys.

    Kept by every layer, attention: the key/value input [b, K, D], k and v [b, K, NH], q + u and
    q + v [b, T, NH], the position projection [K, NH], the context [b, T, NH], the output, its
    dropout mask and the LayerNorm input [b, T, D]; of the scores [b, N, T, K], the float32
    softmax output and the probabilities the context reads (in the compute dtype; with dropatt
    also their dropout mask, one byte per element). Feed-forward: its input [b, T, D], the ReLU
    output and its dropout mask [b, T, F], the output, its dropout mask and the LayerNorm input
    [b, T, D]. Once, at the peak of the backward pass (one layer at a time): the float32
    gradients of the probabilities and of the scores, [b, N, T, K] each. Softmax: head logits,
    log-probabilities and their gradient [b, T, S + C], and as many for the tail clusters'
    tokens (see TAIL_TOKEN_SHARE).

    Every tensor is counted at 4 bytes but the probabilities, which are in the compute dtype:
    under a mixed policy the saved tensors measured as large as float32 ones (LayerNorm, the
    softmax and the loss run in float32), while the probabilities are the one large tensor that
    stays narrow. `width_factor` scales the tensors of width D, NH and F (not the scores [b, N,
    T, K] nor the softmax): see StepCosts. Measured against real steps on CPU: BENCHMARKS.md,
    "The memory estimate of tfxl-train's plan".
    """
    c = config
    mem_len = c.mem_len if mem_len is None else mem_len
    e, w = compute_bytes(mixed_precision), FLOAT32
    b, t, k = batch, c.tgt_len, mem_len + c.tgt_len
    d, nh, f, n = c.d_model, c.n_head * c.d_head, c.d_inner, c.n_head
    drop = 1 if c.dropout > 0 else 0
    scores = b * n * t * k
    attention = (width_factor * w * (b * k * d + 2 * b * k * nh + 2 * b * t * nh + k * nh
                                     + b * t * nh + (2 + drop) * b * t * d)
                 + scores * (w + e + (1 if c.dropatt > 0 else 0)))
    feed_forward = width_factor * w * (b * t * d + (1 + drop) * b * t * f + (2 + drop) * b * t * d)
    clusters = _clusters(c)
    tails = len(clusters) - 1
    head = clusters[0].size + tails
    tail = TAIL_TOKEN_SHARE * max((cl.size for cl in clusters[1:]), default=0)
    softmax = 3 * w * b * t * int(head + tail)
    return {"attention": int(c.n_layer * attention + 2 * w * scores),
            "feed_forward": int(c.n_layer * feed_forward), "softmax": softmax}


@dataclasses.dataclass
class Footprint:
    """The memory of one replica's training step, in bytes, itemised (see the module docstring).
    `activations` holds {"attention", "feed_forward", "softmax"}; `program` is the step's
    program, named `program_name` ("TensorFlow graph", "XLA"). `compiled`, when JAX reported its
    compiled step's buffers (`with_compiled`), replaces weights to activations."""

    parameters: int
    weights: int
    gradients: int
    optimizer: int
    memory_state: int
    activations: dict
    evaluation_memory: int = 0
    gradient_copies: int = 0
    program: int = 0
    program_name: str = ""
    compiled: int = 0

    @property
    def margin(self):
        """MARGIN of the counted items."""
        return int(MARGIN * sum(value for name, value in self._counted()))

    @property
    def total(self):
        return sum(value for name, value in self._counted()) + self.margin

    def _counted(self):
        if self.compiled:
            step = [("compiled step", self.compiled)]
        else:
            step = [("weights", self.weights), ("gradients", self.gradients),
                    ("optimizer", self.optimizer), ("gradient copies", self.gradient_copies),
                    ("memory state", self.memory_state),
                    ("activations", sum(self.activations.values()))]
        return [*step, ("evaluation memory", self.evaluation_memory),
                (self.program_name or "program", self.program)]

    def items(self):
        """[(name, bytes)] in the order of the module docstring; zero items left out."""
        return [(name, value) for name, value in [*self._counted(), ("margin", self.margin)]
                if value]

    def with_compiled(self, analysis_bytes):
        """This footprint with JAX's word for the step (`compiled_bytes` of the compiled
        step's memory_analysis), COMPILED_FACTOR over it for what the process keeps beside."""
        return dataclasses.replace(self, compiled=int(COMPILED_FACTOR * analysis_bytes))


def _step_footprint(config, parameters, batch, mixed_precision, optimizer, costs, activations,
                    memory_state, evaluation_memory=0):
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"unknown optimizer {optimizer!r}: one of {sorted(OPTIMIZER_SLOTS)}")
    e, p = compute_bytes(mixed_precision), parameters
    mixed = e != FLOAT32
    program = (costs.program + costs.per_layer * config.n_layer
               + (costs.mixed + costs.mixed_per_layer * config.n_layer if mixed else 0))
    return Footprint(parameters=p, weights=FLOAT32 * p + (e * p if mixed else 0),
                     gradients=FLOAT32 * p, optimizer=OPTIMIZER_SLOTS[optimizer] * FLOAT32 * p,
                     memory_state=memory_state, activations=activations,
                     evaluation_memory=evaluation_memory,
                     gradient_copies=costs.gradient_copies * FLOAT32 * p,
                     program=program, program_name=costs.name)


def training_footprint(config, batch, mixed_precision="float32", optimizer="adam",
                       eval_settings=None, jit_compile=False, backend="tensorflow"):
    """The `Footprint` of one replica training `config` on [batch, T] segments.

    mixed_precision: the Keras dtype policy name. optimizer: a key of OPTIMIZER_SLOTS.
    eval_settings: the run's evaluation settings ({"tgt_len", "mem_len"}: config.eval_settings())
      when it evaluates during training, else None. jit_compile: the step is XLA-compiled.
    backend: "tensorflow" or "jax" (Keras' backend; JAX's step is always compiled).
    """
    c = config
    costs = step_costs(backend, jit_compile)
    evaluation_memory = 0
    if eval_settings:
        evaluation_memory = evaluation_memory_bytes(c, batch, eval_settings["tgt_len"],
                                                    eval_settings["mem_len"], mixed_precision)
    if c.architecture == "lstm":
        activations = lstm_activation_bytes(c, batch, costs.width_factor)
    else:  # the vanilla Transformer: Transformer-XL's without a memory
        mem_len = c.mem_len if c.architecture == "transformer_xl" else 0
        activations = activation_bytes(c, batch, mem_len, mixed_precision, costs.width_factor)
    return _step_footprint(
        c, parameter_count(c), batch, mixed_precision, optimizer, costs, activations,
        memory_state=2 * batch * training_memory_row_bytes(c, mixed_precision),
        evaluation_memory=evaluation_memory)


def evaluation_memory_bytes(config, batch, tgt_len, mem_len, mixed_precision="float32"):
    """The evaluator's state: key/value memory [b, L, N, H, M] x 2 and position keys
    [L, N, H, K + 1], in the compute dtype; a baseline's, its token window [b, tgt_len - 1]
    (ids and valid flags) or its state."""
    c = config
    if c.architecture == "transformer":
        return 5 * batch * (c.tgt_len - 1)
    if c.architecture == "lstm":
        return batch * training_memory_row_bytes(c, mixed_precision)
    return (compute_bytes(mixed_precision) * c.n_layer * c.n_head * c.d_head
            * (2 * batch * mem_len + mem_len + tgt_len + 1))


def evaluation_footprint(config, batch, tgt_len, mem_len, mixed_precision="float32"):
    """{"weights", "evaluation memory", "activations": bytes} of one replica evaluating
    [batch, tgt_len] segments over `mem_len` memory slots (tfxl-eval's check before it builds
    anything). No backward pass: the activations are one layer's at a time, `activation_bytes`
    of a single layer (its gradient terms stand for the forward pass's temporaries of the same
    [b, N, T, K] shape), and the softmax."""
    e = compute_bytes(mixed_precision)
    p = parameter_count(config)
    if config.architecture == "lstm":
        activations = sum(lstm_activation_bytes(config.replace(tgt_len=tgt_len, n_layer=1),
                                                batch).values())
    elif config.architecture == "transformer":
        # Each of the T positions reads its own window of W = tgt_len (training's) tokens:
        # one layer of b x T windows of W tokens, no memory.
        window = config.replace(n_layer=1)
        activations = sum(activation_bytes(window, batch * tgt_len, 0, mixed_precision).values())
    else:
        c = config.replace(tgt_len=tgt_len, mem_len=mem_len, n_layer=1)
        activations = sum(activation_bytes(c, batch, mem_len, mixed_precision).values())
    return {"weights": FLOAT32 * p + (e * p if e != FLOAT32 else 0),
            "evaluation memory": evaluation_memory_bytes(config, batch, tgt_len, mem_len,
                                                         mixed_precision),
            "activations": activations}


def classifier_training_footprint(config, batch, *, num_classes, pooling, grad_segments,
                                  mixed_precision="float32", optimizer="adam",
                                  jit_compile=False, backend="tensorflow"):
    """The `Footprint` of one replica training a `DocumentClassifier` on `batch` documents.

    The segments before the last `grad_segments` (K) are read without a backward pass, so a
    step keeps what the backward pass needs of K segments (each [batch, T] over M + T keys,
    `activation_bytes` without the softmax: the head is [batch, C]), and the K + 1 memories
    between them [b, L, M, D] (the gradient flows through them). Nothing is carried from step to
    step and nothing is kept between evaluations.
    """
    c = config
    costs = step_costs(backend, jit_compile)
    segment = activation_bytes(c, batch, c.mem_len, mixed_precision, costs.width_factor)
    return _step_footprint(
        c, classifier_parameter_count(c, num_classes, pooling), batch, mixed_precision,
        optimizer, costs, {"attention": grad_segments * segment["attention"],
                           "feed_forward": grad_segments * segment["feed_forward"]},
        memory_state=((grad_segments + 1) * compute_bytes(mixed_precision) * batch * c.n_layer
                      * c.mem_len * c.d_model))


# -- serving: the sizes a request or a generation may allocate ----------------------------------

# Bytes per prompt token of generate's working tensors that grow with B x P: the ids received
# or encoded (int32, int64 when encoded), their left-padded copy and its segments (int32), the
# valid mask and its segments (bool).
PROMPT_TOKEN_BYTES = 4 + 8 + 4 + 4 + 1 + 1


def key_value_slot_bytes(config):
    """Bytes of one slot of a float32 key/value memory: keys and values [L, N, H] and its valid
    flag (8 x n_layer x n_head x d_head + 1)."""
    return 2 * FLOAT32 * config.n_layer * config.n_head * config.d_head + 1


def key_value_memory_row_bytes(config, mem_len):
    """Bytes of one row of a float32 key/value memory of `mem_len` slots (keys, values, valid)."""
    return key_value_slot_bytes(config) * mem_len


def attention_score_bytes(config, batch, tgt_len, keys):
    """One layer's float32 attention scores [batch, N, tgt_len, keys]."""
    return FLOAT32 * batch * config.n_head * tgt_len * keys


def new_token_bytes(batch, max_new_tokens):
    """A generation's buffer of new tokens, [batch, max_new_tokens] int32."""
    return FLOAT32 * batch * max_new_tokens


def most_that_fit(item_bytes, limit):
    """How many items of `item_bytes` bytes (a memory's rows, a request's tokens) fit in `limit`
    bytes (at least 1)."""
    return max(1, limit // max(1, item_bytes))


def classifier_evaluation_bytes(config, parameters, rows, tokens, segment_len, mem_len):
    """An estimate of what a classifier with `parameters` weights holds evaluating `rows`
    documents of `tokens` tokens (a multiple of the segment length T) at once: the weights, the
    padded batch and its aligned copies (int32 and bool [rows, tokens], about six of them), the
    memory between segments ([rows, M, D] per layer) and one segment's attention ([rows, heads,
    T, M + T], a few float32 copies) and feed-forward activations. A bound for refusing sizes no
    machine holds, not a measurement."""
    c, t, m = config, segment_len, mem_len
    return (FLOAT32 * parameters + 24 * rows * tokens
            + FLOAT32 * (c.n_layer + 1) * rows * m * c.d_model
            + 3 * attention_score_bytes(c, rows, t, m + t)
            + 2 * FLOAT32 * rows * t * max(c.d_inner, 3 * c.n_head * c.d_head))
