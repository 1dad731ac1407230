"""Adaptive input embedding (Baevski & Auli 2019) as used by Transformer-XL.

Shape glossary: B batch, T segment length, V vocabulary size, D model size, d_i cluster i's size.
"""

import math

import keras
from keras import ops

from tfxl.backend import is_concrete
from tfxl.layers.adaptive_clusters import cluster_layout


@keras.saving.register_keras_serializable(package="tfxl")
class AdaptiveEmbedding(keras.layers.Layer):
    """Token ids [B, T] -> embeddings [B, T, D], scaled by sqrt(D).

    Frequent ids (small ids, as vocabularies are ordered by frequency) get wide embeddings, rare
    ones narrow embeddings projected up to D. With div_val == 1 there is one table [V, d_embed] (and
    one projection if d_embed != D), so the lookup is a single gather. With div_val > 1 each cluster
    has its own table [n_i, d_i] and projection [d_i, D]; every cluster is looked up for every token
    with clamped ids and masked, which keeps shapes static for XLA/TPU.

    `cluster_weight(i)` / `cluster_projection(i)` expose the tensors the adaptive softmax ties to.

    Ids outside [0, V) raise a ValueError in eager calls, on every backend. Inside a traced
    function (tf.function, XLA, a SavedModel, jax.jit, torch.compile) nothing reads the values:
    what an out-of-range id gives there depends on the backend and device (TensorFlow on CPU:
    InvalidArgumentError with div_val == 1; elsewhere a clamped or wrapped row, zeros or NaN;
    with div_val > 1 zeros everywhere). Check ids before tracing.
    """

    def __init__(self, vocab_size, d_embed, d_model, cutoffs=(), div_val=1, proj_same_dim=True,
                 init_std=0.02, proj_init_std=0.01, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_embed, self.d_model = int(vocab_size), int(d_embed), int(d_model)
        self.cutoffs = tuple(int(c) for c in cutoffs)
        self.div_val, self.proj_same_dim = int(div_val), bool(proj_same_dim)
        self.init_std, self.proj_init_std = float(init_std), float(proj_init_std)
        self.clusters = cluster_layout(self.vocab_size, self.cutoffs, self.d_embed, self.d_model,
                                       self.div_val, self.proj_same_dim)
        self.scale = math.sqrt(self.d_model)

    def build(self, ids_shape=None):
        init = keras.initializers.RandomNormal(stddev=self.init_std)
        proj_init = keras.initializers.RandomNormal(stddev=self.proj_init_std)
        # One attribute per variable (not a list): tf.train.Checkpoint tracks attributes only.
        for i, c in enumerate(self._groups):
            rows = self.vocab_size if self.div_val == 1 else c.size
            setattr(self, f"table_{i}", self.add_weight(name=f"table_{i}", shape=(rows, c.dim),
                                                        initializer=init))
            if c.projected:
                setattr(self, f"projection_{i}", self.add_weight(
                    name=f"projection_{i}", shape=(c.dim, self.d_model), initializer=proj_init))

    @property
    def _groups(self):
        """Clusters that own a table: one shared table when div_val == 1."""
        return [self.clusters[0]] if self.div_val == 1 else self.clusters

    @property
    def tables(self):
        return [getattr(self, f"table_{i}") for i in range(len(self._groups))]

    @property
    def projections(self):
        """Per table, its [d_i, D] projection or None."""
        return [getattr(self, f"projection_{i}", None) for i in range(len(self._groups))]

    def cluster_weight(self, i):
        """Cluster i's embedding rows, [n_i, d_i]."""
        if self.div_val == 1:
            c = self.clusters[i]
            return self.tables[0][c.start:c.end]
        return self.tables[i]

    def cluster_projection(self, i):
        """Cluster i's projection [d_i, D], or None when the cluster is not projected."""
        return self.projections[0 if self.div_val == 1 else i]

    def call(self, token_ids):
        if is_concrete(token_ids):
            self._check_ids(token_ids)
        token_ids = ops.cast(token_ids, "int32")
        if self.div_val == 1:
            embedded = ops.take(self.tables[0], token_ids, axis=0)
            if self.projections[0] is not None:
                embedded = ops.matmul(embedded, self.projections[0])
        else:
            embedded = 0.0
            for c, table, projection in zip(self.clusters, self.tables, self.projections):
                local = ops.clip(token_ids - c.start, 0, c.size - 1)
                part = ops.take(table, local, axis=0)
                if projection is not None:
                    part = ops.matmul(part, projection)
                inside = ops.logical_and(token_ids >= c.start, token_ids < c.end)
                embedded = embedded + part * ops.cast(inside, part.dtype)[..., None]
        return embedded * ops.cast(self.scale, embedded.dtype)

    def _check_ids(self, token_ids):
        ids = ops.convert_to_numpy(token_ids)
        if ids.size == 0:
            return
        low, high = ids.min(), ids.max()
        if low < 0 or high >= self.vocab_size:
            raise ValueError(f"token id {low if low < 0 else high} is outside the vocabulary "
                             f"[0, {self.vocab_size})")

    def compute_output_shape(self, ids_shape):
        return (*ids_shape, self.d_model)

    def get_config(self):
        return {
            **super().get_config(), "vocab_size": self.vocab_size, "d_embed": self.d_embed,
            "d_model": self.d_model, "cutoffs": list(self.cutoffs), "div_val": self.div_val,
            "proj_same_dim": self.proj_same_dim, "init_std": self.init_std,
            "proj_init_std": self.proj_init_std,
        }
