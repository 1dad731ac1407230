"""What a model costs before it runs: its parameter count and the memory of one training step.

Computed from the config alone (no model is built, nothing is allocated), so `tfxl-train` and
`tfxl-classify-train` (`classifier_training_footprint`) can print their plans and refuse a run
that cannot fit before the first step, and the memory benchmark
(`benchmarks/memory_bench.py`) compares the same numbers with the peak RSS of real steps.

Shape glossary: b per-replica batch, L layers, T segment length, M memory length, K = M + T keys,
D model size, N heads, H head size, F d_inner, V vocabulary, S shortlist (cutoffs[0], or V),
C tail clusters, P parameters.

One training step of one replica holds (`training_footprint`):

* weights: 4 B per parameter (variables stay float32 under a mixed policy); a mixed policy adds
  the compute-dtype copy of every weight that the layers cast and the backward pass keeps;
* gradients: 4 B per parameter (the variables' dtype, dense: the trainer densifies them);
* optimizer: its slots, 4 B per parameter each (Adam, AdamW and LAMB keep two);
* memory state: the training memory [b, L, M, D] in the compute dtype, twice (the variable and the
  new memory the step computes before it is assigned);
* activations: what the backward pass keeps, per layer (`activation_bytes`), plus the softmax;
* evaluation memory, when the run evaluates: the evaluator's key/value memory [b, L, N, H, M'] x 2
  and position keys [L, N, H, K' + 1] (M', K' the evaluation settings), kept between passes;
* XLA, with jit_compile: the compiler and the buffers of the compiled step. Not derived but
  measured: on CPU XLA's steps took 0.2-1.2 GiB more than TensorFlow's, growing with the model
  rather than the batch; counted as XLA_BYTES + XLA_BYTES_PER_PARAMETER x P (BENCHMARKS.md).
"""

import dataclasses

from tfxl.layers.adaptive_clusters import cluster_layout

FLOAT32 = 4
# How many float32 slots each optimizer of tfxl-train keeps per parameter.
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2, "lamb": 2}
# The share of the tokens whose target falls into the tail clusters of an adaptive softmax, all
# counted against the largest tail cluster (a cluster's logits exist only for its own tokens).
# Cutoffs are chosen so that the shortlist covers most tokens: wt103's 20,000 shortlist covers
# about 90% of its tokens; 0.2 leaves a margin.
TAIL_TOKEN_SHARE = 0.2
XLA_BYTES = 256 * 2**20
XLA_BYTES_PER_PARAMETER = 16
# Measured peak RSS / (runtime + estimate) of real training steps on CPU: 0.86-1.13 over tiny,
# bench and enwik8_base, float32 and mixed_bfloat16, XLA on and off (BENCHMARKS.md);
# tests/test_plan.py holds the estimate to this factor.
STATED_FACTOR = 1.3


def compute_bytes(mixed_precision):
    """Bytes of one element in the compute dtype of a Keras dtype policy name."""
    return FLOAT32 if mixed_precision in (None, "float32") else 2


def parameter_count(config):
    """The number of trainable parameters of `TransfoXLLM(config)`, counted from the config (the
    sum of its trainable variables' sizes, tested against a built model)."""
    return backbone_parameter_count(config) + _softmax_parameter_count(config)


def backbone_parameter_count(config):
    """The trainable parameters of `TransfoXLBackbone(config)`: the adaptive embedding and the
    layers, without the language model's softmax."""
    c = config
    clusters = cluster_layout(c.vocab_size, c.cutoffs, c.embed_dim, c.d_model, c.div_val,
                              c.proj_same_dim)
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
    clusters = cluster_layout(c.vocab_size, c.cutoffs, c.embed_dim, c.d_model, c.div_val,
                              c.proj_same_dim)
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


def classifier_parameter_count(config, num_classes, pooling):
    """The trainable parameters of `DocumentClassifier(config, num_classes, pooling)`: the
    backbone, the head [D, C] + [C], and the segment attention's query [D] when it pools."""
    query = config.d_model if pooling == "segment_attention" else 0
    return backbone_parameter_count(config) + config.d_model * num_classes + num_classes + query


def activation_bytes(config, batch, mem_len=None, mixed_precision="float32"):
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
    stays narrow. Measured against real steps on CPU: BENCHMARKS.md, "The memory estimate of
    tfxl-train's plan".
    """
    c = config
    mem_len = c.mem_len if mem_len is None else mem_len
    e, w = compute_bytes(mixed_precision), FLOAT32
    b, t, k = batch, c.tgt_len, mem_len + c.tgt_len
    d, nh, f, n = c.d_model, c.n_head * c.d_head, c.d_inner, c.n_head
    drop = 1 if c.dropout > 0 else 0
    scores = b * n * t * k
    attention = w * (b * k * d + 2 * b * k * nh + 2 * b * t * nh + k * nh + b * t * nh
                     + (2 + drop) * b * t * d) + scores * (w + e + (1 if c.dropatt > 0 else 0))
    feed_forward = w * (b * t * d + (1 + drop) * b * t * f + (2 + drop) * b * t * d)
    clusters = cluster_layout(c.vocab_size, c.cutoffs, c.embed_dim, c.d_model, c.div_val,
                              c.proj_same_dim)
    tails = len(clusters) - 1
    head = clusters[0].size + tails
    tail = TAIL_TOKEN_SHARE * max((cl.size for cl in clusters[1:]), default=0)
    softmax = 3 * w * b * t * int(head + tail)
    return {"attention": c.n_layer * attention + 2 * w * scores,
            "feed_forward": c.n_layer * feed_forward, "softmax": softmax}


@dataclasses.dataclass
class Footprint:
    """The memory of one replica's training step, in bytes, itemised (see the module docstring).
    `activations` holds {"attention", "feed_forward", "softmax"}."""

    parameters: int
    weights: int
    gradients: int
    optimizer: int
    memory_state: int
    activations: dict
    evaluation_memory: int = 0
    xla: int = 0

    @property
    def total(self):
        return (self.weights + self.gradients + self.optimizer + self.memory_state
                + sum(self.activations.values()) + self.evaluation_memory + self.xla)

    def items(self):
        """[(name, bytes)] in the order of the module docstring; zero items left out."""
        items = [("weights", self.weights), ("gradients", self.gradients),
                 ("optimizer", self.optimizer), ("memory state", self.memory_state),
                 ("activations", sum(self.activations.values())),
                 ("evaluation memory", self.evaluation_memory), ("XLA", self.xla)]
        return [(name, value) for name, value in items if value]


def training_footprint(config, batch, mixed_precision="float32", optimizer="adam",
                       eval_settings=None, jit_compile=False):
    """The `Footprint` of one replica training `config` on [batch, T] segments.

    mixed_precision: the Keras dtype policy name. optimizer: a key of OPTIMIZER_SLOTS.
    eval_settings: the run's evaluation settings ({"tgt_len", "mem_len"}: config.eval_settings())
      when it evaluates during training, else None. jit_compile: the step is XLA-compiled.
    """
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"unknown optimizer {optimizer!r}: one of {sorted(OPTIMIZER_SLOTS)}")
    c = config
    e = compute_bytes(mixed_precision)
    p = parameter_count(c)
    weights = FLOAT32 * p + (e * p if e != FLOAT32 else 0)
    memory_state = 2 * e * batch * c.n_layer * c.mem_len * c.d_model
    evaluation_memory = 0
    if eval_settings:
        evaluation_memory = evaluation_memory_bytes(c, batch, eval_settings["tgt_len"],
                                                    eval_settings["mem_len"], mixed_precision)
    return Footprint(parameters=p, weights=weights, gradients=FLOAT32 * p,
                     optimizer=OPTIMIZER_SLOTS[optimizer] * FLOAT32 * p,
                     memory_state=memory_state,
                     activations=activation_bytes(c, batch, c.mem_len, mixed_precision),
                     evaluation_memory=evaluation_memory,
                     xla=XLA_BYTES + XLA_BYTES_PER_PARAMETER * p if jit_compile else 0)


def evaluation_memory_bytes(config, batch, tgt_len, mem_len, mixed_precision="float32"):
    """The evaluator's state: key/value memory [b, L, N, H, M] x 2 and position keys
    [L, N, H, K + 1], in the compute dtype."""
    c = config
    return (compute_bytes(mixed_precision) * c.n_layer * c.n_head * c.d_head
            * (2 * batch * mem_len + mem_len + tgt_len + 1))


def evaluation_footprint(config, batch, tgt_len, mem_len, mixed_precision="float32"):
    """{"weights", "evaluation memory", "activations": bytes} of one replica evaluating
    [batch, tgt_len] segments over `mem_len` memory slots (tfxl-eval's check before it builds
    anything). No backward pass: the activations are one layer's at a time, `activation_bytes`
    of a single layer (its gradient terms stand for the forward pass's temporaries of the same
    [b, N, T, K] shape), and the softmax."""
    c = config.replace(tgt_len=tgt_len, mem_len=mem_len, n_layer=1)
    e = compute_bytes(mixed_precision)
    p = parameter_count(config)
    return {"weights": FLOAT32 * p + (e * p if e != FLOAT32 else 0),
            "evaluation memory": evaluation_memory_bytes(config, batch, tgt_len, mem_len,
                                                         mixed_precision),
            "activations": sum(activation_bytes(c, batch, mem_len, mixed_precision).values())}


def classifier_training_footprint(config, batch, *, num_classes, pooling, grad_segments,
                                  mixed_precision="float32", optimizer="adam",
                                  jit_compile=False):
    """The `Footprint` of one replica training a `DocumentClassifier` on `batch` documents.

    The segments before the last `grad_segments` (K) are read without a backward pass, so a
    step keeps what the backward pass needs of K segments (each [batch, T] over M + T keys,
    `activation_bytes` without the softmax: the head is [batch, C]), and the K + 1 memories
    between them [b, L, M, D] (the gradient flows through them). Nothing is carried from step to
    step and nothing is kept between evaluations.
    """
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"unknown optimizer {optimizer!r}: one of {sorted(OPTIMIZER_SLOTS)}")
    c = config
    e = compute_bytes(mixed_precision)
    p = classifier_parameter_count(c, num_classes, pooling)
    segment = activation_bytes(c, batch, c.mem_len, mixed_precision)
    return Footprint(parameters=p, weights=FLOAT32 * p + (e * p if e != FLOAT32 else 0),
                     gradients=FLOAT32 * p, optimizer=OPTIMIZER_SLOTS[optimizer] * FLOAT32 * p,
                     memory_state=(grad_segments + 1) * e * batch * c.n_layer * c.mem_len
                     * c.d_model,
                     activations={"attention": grad_segments * segment["attention"],
                                  "feed_forward": grad_segments * segment["feed_forward"]},
                     xla=XLA_BYTES + XLA_BYTES_PER_PARAMETER * p if jit_compile else 0)
