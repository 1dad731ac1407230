"""Adaptive log-softmax with projections (Grave et al. 2017), as used by Transformer-XL.

Shape glossary: B batch, T segment length, V vocabulary size, D model size, C number of tail
clusters (= len(cutoffs)), S shortlist size (= cutoffs[0]), d_i cluster i's size.

The head scores the S shortlist ids plus one logit per tail cluster; tail cluster i's logit sits at
head index S + i - 1 (the TF reference order; the PyTorch reference reads them reversed, which the
checkpoint converter handles). log p(t) = head[t] for t < S, else
head[S + i - 1] + tail_i[t - start_i].
"""

import keras
from keras import ops

from tfxl import backend
from tfxl.layers.adaptive_clusters import cluster_layout

# The static-shape tail path holds a tail cluster's logits for this many (row, id) pairs at a
# time: [rows, n_i] float32 stays within 64 MiB whatever the vocabulary (wt103's last cluster,
# 160,000 ids, in chunks of 104 rows).
TAIL_CHUNK_ELEMENTS = 2 ** 24


@keras.saving.register_keras_serializable(package="tfxl")
class AdaptiveSoftmax(keras.layers.Layer):
    """Hidden states [B, T, D] -> per-token NLL [B, T] of given targets, or log-probs [B, T, V].

    Call args:
      hidden: [B, T, D].
      targets: int [B, T] or None. With targets, returns the NLL (float32) of each target and
        never builds [B, T, V] logits: on TensorFlow each tail cluster is evaluated only on the
        tokens whose target falls into it (a dynamic gather); on JAX and PyTorch on every token,
        in chunks of bounded memory (static shapes). Without targets, returns full float32
        log-probabilities [B, T, V].
      tied_weights: list of C + 1 tensors [n_i, d_i] (the input embedding's clusters) when
        `tie_weight`; tied_projections: list of C + 1 tensors [d_i, D] or None, used for clusters
        whose `tie_projs` flag is set (the softmax projects with their transpose).
    With cutoffs == () this is an ordinary (optionally projected) softmax.
    """

    def __init__(self, vocab_size, d_embed, d_model, cutoffs=(), div_val=1, proj_same_dim=True,
                 tie_weight=False, tie_projs=None, init_std=0.02, proj_init_std=0.01, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_embed, self.d_model = int(vocab_size), int(d_embed), int(d_model)
        self.cutoffs = tuple(int(c) for c in cutoffs)
        self.div_val, self.proj_same_dim = int(div_val), bool(proj_same_dim)
        self.tie_weight = bool(tie_weight)
        self.clusters = cluster_layout(self.vocab_size, self.cutoffs, self.d_embed, self.d_model,
                                       self.div_val, self.proj_same_dim)
        self.tie_projs = (tuple(bool(t) for t in tie_projs) if tie_projs is not None
                          else (False,) * len(self.clusters))
        if len(self.tie_projs) != len(self.clusters):
            raise ValueError(f"AdaptiveSoftmax: tie_projs needs {len(self.clusters)} flags, got "
                             f"{len(self.tie_projs)}")
        self.init_std, self.proj_init_std = float(init_std), float(proj_init_std)

    @property
    def shortlist_size(self):
        return self.clusters[0].end

    @property
    def num_tail_clusters(self):
        return len(self.clusters) - 1

    def build(self, hidden_shape=None):
        init = keras.initializers.RandomNormal(stddev=self.init_std)
        proj_init = keras.initializers.RandomNormal(stddev=self.proj_init_std)
        # One attribute per variable (not a list): tf.train.Checkpoint tracks attributes only.
        for i, c in enumerate(self.clusters):
            if not self.tie_weight:
                setattr(self, f"weight_{i}", self.add_weight(
                    name=f"weight_{i}", shape=(c.size, c.dim), initializer=init))
            if c.projected and not self.tie_projs[i]:
                setattr(self, f"projection_{i}", self.add_weight(
                    name=f"projection_{i}", shape=(self.d_model, c.dim), initializer=proj_init))
        # One bias over the whole vocabulary, sliced per cluster (biases are never tied).
        self.bias = self.add_weight(name="bias", shape=(self.vocab_size,), initializer="zeros")
        if self.num_tail_clusters:
            d0 = self.clusters[0].dim
            self.cluster_weight = self.add_weight(
                name="cluster_weight", shape=(self.num_tail_clusters, d0), initializer=init)
            self.cluster_bias = self.add_weight(
                name="cluster_bias", shape=(self.num_tail_clusters,), initializer="zeros")

    @property
    def weights_per_cluster(self):
        """The softmax's own [n_i, d_i] output tables; empty when tied to the embedding."""
        return [] if self.tie_weight else [getattr(self, f"weight_{i}")
                                           for i in range(len(self.clusters))]

    @property
    def projections(self):
        """Per cluster, the softmax's own [D, d_i] projection or None (absent or tied)."""
        return [getattr(self, f"projection_{i}", None) for i in range(len(self.clusters))]

    # -- pieces -------------------------------------------------------------------------------
    def _cluster_params(self, i, tied_weights, tied_projections):
        c = self.clusters[i]
        weight = tied_weights[i] if self.tie_weight else self.weights_per_cluster[i]
        if not c.projected:
            projection = None
        elif self.tie_projs[i]:
            projection = ops.transpose(tied_projections[i])
        else:
            projection = self.projections[i]
        return weight, self.bias[c.start:c.end], projection

    def _logits(self, hidden, weight, bias, projection):
        if projection is not None:
            hidden = ops.matmul(hidden, projection)
        return ops.cast(ops.matmul(hidden, ops.transpose(weight)) + bias, "float32")

    def _head_log_probs(self, hidden, tied_weights, tied_projections):
        weight, bias, projection = self._cluster_params(0, tied_weights, tied_projections)
        if self.num_tail_clusters:
            weight = ops.concatenate([weight, ops.cast(self.cluster_weight, weight.dtype)], axis=0)
            bias = ops.concatenate([bias, ops.cast(self.cluster_bias, bias.dtype)], axis=0)
        return ops.log_softmax(self._logits(hidden, weight, bias, projection), axis=-1)

    def _check_tied(self, tied_weights, tied_projections):
        if self.tie_weight and tied_weights is None:
            raise ValueError("AdaptiveSoftmax(tie_weight=True) needs tied_weights")
        if any(c.projected and t for c, t in zip(self.clusters, self.tie_projs)) and (
                tied_projections is None):
            raise ValueError("AdaptiveSoftmax with tied projections needs tied_projections")

    # -- call ---------------------------------------------------------------------------------
    def call(self, hidden, targets=None, tied_weights=None, tied_projections=None):
        self._check_tied(tied_weights, tied_projections)
        head = self._head_log_probs(hidden, tied_weights, tied_projections)  # [B, T, S + C]
        if targets is None:
            return self._full_log_probs(hidden, head, tied_weights, tied_projections)
        return self._nll(hidden, targets, head, tied_weights, tied_projections)

    def _full_log_probs(self, hidden, head, tied_weights, tied_projections):
        shortlist = self.shortlist_size
        parts = [head[..., :shortlist]]
        for i in range(1, len(self.clusters)):
            tail = ops.log_softmax(
                self._logits(hidden, *self._cluster_params(i, tied_weights, tied_projections)),
                axis=-1)
            parts.append(head[..., shortlist + i - 1:shortlist + i] + tail)
        return ops.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]

    def _nll(self, hidden, targets, head, tied_weights, tied_projections):
        targets = ops.cast(targets, "int32")
        shortlist = self.shortlist_size
        # Head index of each target: itself in the shortlist, else its cluster's logit.
        head_index = targets
        for i in range(1, len(self.clusters)):
            c = self.clusters[i]
            in_cluster = ops.logical_and(targets >= c.start, targets < c.end)
            head_index = ops.where(in_cluster, shortlist + i - 1, head_index)
        kernels = backend.current()
        log_prob = kernels.target_log_probs(head, head_index)  # [B, T]
        tail_log_prob = (self._sparse_tail_log_prob if kernels.SPARSE_TAIL
                         else self._static_tail_log_prob)
        for i in range(1, len(self.clusters)):
            log_prob = log_prob + tail_log_prob(
                hidden, targets, self.clusters[i],
                *self._cluster_params(i, tied_weights, tied_projections))
        return -log_prob

    def _sparse_tail_log_prob(self, hidden, targets, cluster, weight, bias, projection):
        """log p(target | cluster) [B, T], zero where the target is outside `cluster`: the tail
        evaluated only on the tokens of this cluster (TensorFlow: a dynamic gather, whose shape
        XLA bounds by B*T with its dynamic padder, so it still compiles for TPU)."""
        import tensorflow as tf
        where = tf.where((targets >= cluster.start) & (targets < cluster.end))  # [n, 2]
        tail = tf.nn.log_softmax(self._logits(tf.gather_nd(hidden, where), weight, bias,
                                              projection), axis=-1)
        local = tf.gather_nd(targets, where) - cluster.start
        chosen = tf.gather(tail, local, axis=-1, batch_dims=1)
        return tf.scatter_nd(where, chosen, tf.shape(targets, out_type=tf.int64))

    def _static_tail_log_prob(self, hidden, targets, cluster, weight, bias, projection):
        """`_sparse_tail_log_prob` with static shapes (the other backends): exact, every row
        scored.

        log p(t | cluster) = logit_t - logsumexp(logits). The target's logit is one gathered
        output row per token; the logsumexp runs over chunks of rows (TAIL_CHUNK_ELEMENTS) and
        is recomputed in the backward pass (`keras.remat`), so memory stays bounded however large
        the cluster. Compute is the dense tail's: n_i * d_i per row, for wt103 about 0.75 of the
        head's, where the sparse path spends it on the cluster's own rows only.
        """
        inside = ops.logical_and(targets >= cluster.start, targets < cluster.end)
        local = ops.clip(targets - cluster.start, 0, cluster.size - 1)
        rows = ops.reshape(hidden, (-1, hidden.shape[-1]))                          # [R, D]
        if projection is not None:
            rows = ops.matmul(rows, projection)                                     # [R, d_i]
        local = ops.reshape(local, (-1,))
        weight = ops.cast(weight, rows.dtype)
        target_logit = (ops.sum(ops.cast(rows, "float32") * ops.cast(
            ops.take(weight, local, axis=0), "float32"), axis=-1)
            + ops.cast(ops.take(bias, local), "float32"))  # float32 as `_logits`' are

        # The weights are arguments, not captured: a rematerialised function's gradient reaches
        # its arguments only (tf.recompute_grad's, where this path is tested).
        logsumexp = keras.remat(lambda chunk, weight, bias: ops.logsumexp(
            self._logits(chunk, weight, bias, None), axis=-1))
        n_rows = rows.shape[0]
        chunk = max(1, min(n_rows, TAIL_CHUNK_ELEMENTS // cluster.size))
        padded = ops.pad(rows, [[0, -n_rows % chunk], [0, 0]])
        normaliser = ops.map(lambda chunk: logsumexp(chunk, weight, bias),
                             ops.reshape(padded, (-1, chunk, rows.shape[-1])))
        tail = target_logit - ops.reshape(normaliser, (-1,))[:n_rows]
        return ops.where(inside, ops.reshape(tail, ops.shape(targets)), 0.0)

    def compute_output_shape(self, hidden_shape, targets_shape=None, *args, **kwargs):
        if targets_shape is None:
            return (*hidden_shape[:-1], self.vocab_size)
        return tuple(hidden_shape[:-1])

    def get_config(self):
        return {
            **super().get_config(), "vocab_size": self.vocab_size, "d_embed": self.d_embed,
            "d_model": self.d_model, "cutoffs": list(self.cutoffs), "div_val": self.div_val,
            "proj_same_dim": self.proj_same_dim, "tie_weight": self.tie_weight,
            "tie_projs": list(self.tie_projs), "init_std": self.init_std,
            "proj_init_std": self.proj_init_std,
        }
