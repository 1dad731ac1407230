"""Vocabulary clusters shared by the adaptive embedding and the adaptive softmax (Baevski & Auli
2019; Grave et al. 2017).

Cluster 0 (the shortlist) holds ids [0, cutoffs[0]); cluster i holds [cutoffs[i-1], cutoffs[i]);
the last ends at vocab_size. Cluster i has d_embed // div_val**i dimensions.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Cluster:
    start: int
    end: int
    dim: int
    projected: bool  # whether a [dim, d_model] projection exists for this cluster

    @property
    def size(self):
        return self.end - self.start


def cluster_layout(vocab_size, cutoffs, d_embed, d_model, div_val, proj_same_dim=True):
    """The clusters, shortlist first.

    With div_val == 1 every cluster has d_embed dims and is projected only when d_embed != d_model.
    With div_val > 1 a cluster is projected when its size differs from d_model or `proj_same_dim`
    (the PyTorch reference always projects; the TF reference has the flag).
    """
    bounds = [0, *cutoffs, vocab_size]
    clusters = []
    for i in range(len(bounds) - 1):
        dim = d_embed // (div_val ** i)
        if div_val == 1:
            projected = d_embed != d_model
        else:
            projected = dim != d_model or proj_same_dim
        clusters.append(Cluster(bounds[i], bounds[i + 1], dim, projected))
    return clusters
