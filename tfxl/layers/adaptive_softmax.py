"""Adaptive log-softmax with projections (Grave et al. 2017), as used by Transformer-XL.

Shape glossary: B batch, T segment length, V vocabulary size, D model size, C number of tail
clusters (= len(cutoffs)), S shortlist size (= cutoffs[0]), d_i cluster i's size.

The head scores the S shortlist ids plus one logit per tail cluster; tail cluster i's logit sits at
head index S + i - 1 (the TF reference order; the PyTorch reference reads them reversed, which the
checkpoint converter handles). log p(t) = head[t] for t < S, else
head[S + i - 1] + tail_i[t - start_i].
"""

import keras
import tensorflow as tf
from keras import ops

from tfxl.layers.adaptive_clusters import cluster_layout


@keras.saving.register_keras_serializable(package="tfxl")
class AdaptiveSoftmax(keras.layers.Layer):
    """Hidden states [B, T, D] -> per-token NLL [B, T] of given targets, or log-probs [B, T, V].

    Call args:
      hidden: [B, T, D].
      targets: int [B, T] or None. With targets, returns the NLL (float32) of each target and
        never builds [B, T, V] logits: each tail cluster is evaluated only on the tokens whose
        target falls into it. Without targets, returns full float32 log-probabilities [B, T, V].
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
        targets = tf.cast(targets, tf.int32)
        shortlist = self.shortlist_size
        # Head index of each target: itself in the shortlist, else its cluster's logit.
        head_index = targets
        for i in range(1, len(self.clusters)):
            c = self.clusters[i]
            in_cluster = (targets >= c.start) & (targets < c.end)
            head_index = tf.where(in_cluster, shortlist + i - 1, head_index)
        log_prob = tf.gather(head, head_index, axis=-1, batch_dims=2)  # [B, T]
        for i in range(1, len(self.clusters)):
            c = self.clusters[i]
            # Only the tokens of this cluster: a dynamic gather. Under XLA the shape is bounded by
            # B*T (the dynamic padder), so it still compiles for TPU.
            where = tf.where((targets >= c.start) & (targets < c.end))  # [n, 2]
            chosen_hidden = tf.gather_nd(hidden, where)                  # [n, D]
            tail = tf.nn.log_softmax(
                self._logits(chosen_hidden, *self._cluster_params(i, tied_weights,
                                                                  tied_projections)), axis=-1)
            local = tf.gather_nd(targets, where) - c.start
            tail_log_prob = tf.gather(tail, local, axis=-1, batch_dims=1)
            log_prob = tf.tensor_scatter_nd_add(log_prob, where, tail_log_prob)
        return -log_prob

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
