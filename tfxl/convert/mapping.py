"""Name/layout mapping from the published Transformer-XL checkpoints to `tfxl.TransfoXLLM`.

A conversion is a *plan*: the tensor names (and shapes) the checkpoint must hold for the given
`TransfoXLConfig`, and for every model variable how to build it from those tensors. The plan is
checked as a whole before anything is loaded, so one `ConversionError` lists every missing,
unknown and mis-shaped tensor.

Layouts (see docs/convert.md for the full table):
  * PyTorch `MemTransformerLM` / Hugging Face `TransfoXLLMHeadModel`: `nn.Linear` weights are
    [out, in]; `qkv_net` is one [3*N*H, D] weight whose output splits into q | k | v, each
    head-major (index n*H + h); `emb_projs[i]` is [D, d_i] applied as `x @ P.T`; `out_projs[i]`
    is [D, d_i] applied as `h @ P`. The original PyTorch head reads tail cluster i's logit at
    `head[-i]` (cluster rows reversed); Hugging Face reads it at `cutoffs[0] + i - 1`.
  * TF1 (`tf/model.py`): dense kernels are [in, out]; `proj_W` is [d_i, D] applied as `x @ W`;
    softmax `proj` is [d_i, D] applied as `h @ proj.T`; cluster i's logit is at
    `cutoffs[0] + i - 1`; the softmax weights are always the embedding tables.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Callable, Optional

import numpy as np

from tfxl.convert.errors import ConversionError

FORMATS = ("pytorch", "huggingface", "tf1")
# Tensor names a mismatch error shows per kind (missing, unknown, misshaped); the rest are
# counted (a wrong config lists hundreds: the line was 10 KB) and kept in its `details`.
SHOWN = 5

# TF1 optimizer state and bookkeeping, never part of the model.
_TF1_IGNORED = re.compile(r"(^|/)(global_step|beta[12]_power)$|/Adam(_\d+)?$|"
                          r"/ExponentialMovingAverage$")


@dataclasses.dataclass
class _Entry:
    target: Optional[str]                 # model variable path, None for a check-only entry
    sources: list
    build: Callable


class Plan:
    """Expected checkpoint tensors and how each model variable is built from them."""

    def __init__(self, source, fmt, config=None):
        self.source, self.fmt, self.config = source, fmt, config
        self.expected = {}                # name -> expected shape
        self.entries = []
        self.ignored = set()
        self.ignore_pattern = None
        self.config_problems = []

    # -- declaring ----------------------------------------------------------------------------
    def need(self, name, shape):
        self.expected[name] = tuple(int(d) for d in shape)
        return name

    def tied(self, primary, aliases, shape, what):
        """One tensor that the checkpoint may store under several names (tied parameters).

        Returns the name to load. Every present name is checked for shape and, when more than
        one is present, for equal values (the converted model shares one variable).
        """
        present = [n for n in [primary, *aliases] if n in self.source]
        if not present:
            return self.need(primary, shape)
        for name in present:
            self.need(name, shape)
        chosen = present[0]
        for other in present[1:]:
            self.check_equal(chosen, other, what)
        return chosen

    def check_equal(self, a, b, what):
        def build(x, y):
            if x.shape == y.shape and np.array_equal(x, y):
                return None
            return f"{a} != {b} ({what})"
        self.entries.append(_Entry(None, [a, b], build))

    def add(self, target, sources, build=lambda x: x):
        self.entries.append(_Entry(target, list(sources), build))

    # -- checking -----------------------------------------------------------------------------
    def problems(self):
        present = self.source.shapes
        missing = sorted(n for n in self.expected if n not in present)
        mismatched = sorted(
            f"{n} (expected {list(self.expected[n])}, found {list(present[n])})"
            for n in self.expected if n in present and present[n] != self.expected[n])
        unknown = sorted(
            n for n in present if n not in self.expected and n not in self.ignored
            and not (self.ignore_pattern is not None and self.ignore_pattern.search(n)))
        return missing, unknown, mismatched

    def check(self):
        if self.config_problems:
            raise ConversionError(f"config does not fit a {self.fmt} checkpoint: "
                                  + "; ".join(self.config_problems))
        missing, unknown, mismatched = self.problems()
        if missing or unknown or mismatched:
            groups = [(f"missing {len(missing)} tensor(s)", missing),
                      (f"unknown {len(unknown)} tensor(s)", unknown),
                      (f"{len(mismatched)} shape mismatch(es)", mismatched)]
            groups = [(title, names) for title, names in groups if names]
            parts = [f"{title}: {', '.join(names[:SHOWN])}"
                     + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
                     for title, names in groups]
            present = self.source.shapes
            shapes = {n: (self.expected[n], present[n]) for n in self.expected
                      if n in present and present[n] != self.expected[n]}
            hints = "; ".join(filter(None, [
                _size_hint(self.config, shapes, present, missing, len(self.expected)),
                _hints(self.fmt, missing, unknown, shapes)]))
            listed = any(len(names) > SHOWN for _, names in groups)
            raise ConversionError(
                f"{self.source.description or 'checkpoint'} does not match the config "
                f"({self.fmt}): " + "; ".join(parts) + (f". Hint: {hints}" if hints else "")
                + (" (--verbosity=1 lists every tensor)" if listed else ""),
                details=[line for title, names in groups
                         for line in [f"{title}:", *(f"  {name}" for name in names)]]
                if listed else ())

    # -- applying -----------------------------------------------------------------------------
    def apply(self, model):
        """Assigns every model variable; raises if a variable is left unassigned."""
        self.check()
        variables = {id(v): v for v in model.weights}
        assigned, differ, cache = set(), [], {}
        uses = {}
        for entry in self.entries:
            for n in entry.sources:
                uses[n] = uses.get(n, 0) + 1

        def load(name):
            if name not in cache:
                cache[name] = self.source.get(name)
            value = cache[name]
            uses[name] -= 1
            if not uses[name]:  # last use: let large tensors go as soon as possible
                del cache[name]
            return value

        for entry in self.entries:
            arrays = [load(n) for n in entry.sources]
            if entry.target is None:
                result = entry.build(*arrays)
                if result:
                    differ.append(result)
                continue
            value = np.asarray(entry.build(*[a.astype(np.float32) for a in arrays]), np.float32)
            variable = _resolve(model, entry.target)
            if tuple(variable.shape) != value.shape:
                raise ConversionError(f"internal: {entry.target} has shape "
                                      f"{list(variable.shape)}, built {list(value.shape)} from "
                                      f"{entry.sources}")
            variable.assign(value.astype(variable.dtype))
            assigned.add(id(variable))
        if differ:
            raise ConversionError(
                "tensors that the config ties differ in the checkpoint (untie them in the "
                "config: tie_weight / tie_projs / untie_r): " + "; ".join(differ))
        left = [v.path for i, v in variables.items() if i not in assigned]
        if left:
            raise ConversionError(f"internal: model variables not converted: {left}")


def _resolve(model, path):
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


# The config's sizes a checkpoint's shapes show, in the order a hint names them.
_SIZE_FIELDS = ("d_model", "n_head", "d_head", "d_inner", "d_embed", "vocab_size")
_LAYER_INDEX = re.compile(r"(?:^|\.|/)(?:layers\.|layer_)(\d+)[./]")


def _layers(names):
    """1 + the largest layer index among `names` (0: none)."""
    return max((int(m.group(1)) + 1 for n in names for m in [_LAYER_INDEX.search(n)] if m),
               default=0)


def _size_hint(config, shapes, present, missing, expected_count):
    """The likely cause when the config's size is wrong: another layer count (the layers the
    checkpoint's names number), or most expected tensors misshaped, each differing dimension
    counted and matched with the config's sizes of that value; '' otherwise.

    shapes: {name: (expected, found)} of the misshaped; present: the checkpoint's names."""
    if config is None:
        return ""
    causes = []
    layers = _layers(present)
    if layers and layers != config.n_layer:
        causes.append(f"the checkpoint has {layers} layers, the config's n_layer "
                      f"{config.n_layer}")
    if shapes:
        pairs = collections.Counter(
            (e, f) for expected, found in shapes.values() if len(expected) == len(found)
            for e, f in zip(expected, found) if e != f)
        for (e, f), count in pairs.most_common():
            fields = [name for name in _SIZE_FIELDS if getattr(config, name, None) == e]
            if fields:
                causes.append(f"the config's {', '.join(fields)} {e} is {f} in the checkpoint "
                              f"({count} dimensions)")
            if len(causes) == 3:
                break
    if not causes:
        return ""
    return ("the config's size differs from the checkpoint's: " + "; ".join(causes)
            + " (compare d_model, n_head, d_head, d_inner and n_layer first)")


def _hints(fmt, missing, unknown, shapes=None):
    """Hints from the names that differ; `shapes`: {name: (expected, found)} of the misshaped."""
    shapes = shapes or {}
    hints = []
    if any(re.search(r"(emb_projs|out_projs)\.\d+$", n) for n in unknown):
        hints.append("the checkpoint has projections the config does not (PyTorch/HF project "
                     "every cluster when div_val > 1: proj_same_dim=True; with div_val == 1 a "
                     "projection exists iff d_embed != d_model; check tie_projs)")
    if any(re.search(r"(proj_W|/proj)$", n) for n in unknown):
        hints.append("the checkpoint has projections the config does not (check d_embed, "
                     "proj_same_dim, tie_projs)")
    # untie_r changes the r biases' layout (one per layer or shared: names or rank), not their
    # size: a bias of another size says d_head/n_head, which the size hint names.
    r_bias = re.compile(r"r_[wr]_bias")
    if ((any(r_bias.search(n) for n in missing) and any(r_bias.search(n) for n in unknown))
            or any(r_bias.search(n) and len(e) != len(f) for n, (e, f) in shapes.items())):
        hints.append("check untie_r")
    if any("out_layers" in n and n.endswith(".weight") for n in unknown):
        hints.append("the checkpoint has separate softmax weights: tie_weight=False")
    if fmt == "huggingface" and any(not n.startswith(("transformer.", "crit.")) for n in unknown):
        hints.append("Hugging Face names start with 'transformer.'/'crit.'; use "
                     "--format=pytorch for the original MemTransformerLM names")
    if fmt == "pytorch" and any(n.startswith("transformer.") for n in unknown):
        hints.append("names start with 'transformer.': use --format=huggingface")
    return "; ".join(hints)


# ------------------------------------------------------------------------------------------------
def _transpose(x):
    return x.T


def _heads_in_out(n_head, d_head):
    """[N*H, D] (PyTorch out x in, head-major rows) -> [D, N, H]."""
    return lambda w: w.T.reshape(w.shape[1], n_head, d_head)


def _chunk(part, n_head, d_head, axis_out):
    """One of q|k|v from a fused projection, as [D, N, H]."""
    size = n_head * d_head

    def build(w):
        if axis_out == 0:           # PyTorch [3*N*H, D]
            w = w[part * size:(part + 1) * size].T
        else:                       # TF1 kernel [D, 3*N*H]
            w = w[:, part * size:(part + 1) * size]
        return w.reshape(w.shape[0], n_head, d_head)
    return build


def _layout(config):
    # Imported here: tfxl.layers loads Keras, which tfxl-convert's --help should not wait for.
    from tfxl.layers.adaptive_clusters import cluster_layout

    return cluster_layout(config.vocab_size, config.cutoffs, config.embed_dim, config.d_model,
                          config.div_val, config.proj_same_dim)


def plan_pytorch(source, config, huggingface=False):
    """Plan for an original PyTorch `MemTransformerLM` or a Hugging Face `TransfoXLLMHeadModel`
    state dict."""
    c = config
    fmt = "huggingface" if huggingface else "pytorch"
    plan = Plan(source, fmt, config)
    P = "transformer." if huggingface else ""
    D, N, H, F, L = c.d_model, c.n_head, c.d_head, c.d_inner, c.n_layer
    clusters = _layout(c)
    tie_projs = c.cluster_tie_projs
    plan.ignored.add(P + "pos_emb.inv_freq")  # a buffer recomputed from d_model

    # Adaptive embedding (and the softmax tensors tied to it).
    groups = [clusters[0]] if c.div_val == 1 else clusters
    for j, g in enumerate(groups):
        rows = c.vocab_size if c.div_val == 1 else g.size
        aliases = [f"crit.out_layers.{j}.weight"] if c.tie_weight else []
        table = plan.tied(f"{P}word_emb.emb_layers.{j}.weight", aliases, (rows, g.dim),
                          "tie_weight")
        plan.add(f"backbone.embedding.table_{j}", [table])
        if g.projected:
            users = [i for i, cl in enumerate(clusters) if cl.projected and tie_projs[i]
                     and (c.div_val == 1 or i == j)]
            proj = plan.tied(f"{P}word_emb.emb_projs.{j}", [f"crit.out_projs.{i}" for i in users],
                             (D, g.dim), "tie_projs")
            plan.add(f"backbone.embedding.projection_{j}", [proj], _transpose)

    # Transformer layers.
    for l in range(L):
        a, f = f"{P}layers.{l}.dec_attn.", f"{P}layers.{l}.pos_ff."
        t = f"backbone.block_{l}."
        qkv = plan.need(a + "qkv_net.weight", (3 * N * H, D))
        for part, name in enumerate(("query", "key", "value")):
            plan.add(t + f"attention.{name}_kernel", [qkv], _chunk(part, N, H, axis_out=0))
        plan.add(t + "attention.position_kernel", [plan.need(a + "r_net.weight", (N * H, D))],
                 _heads_in_out(N, H))
        plan.add(t + "attention.output_kernel", [plan.need(a + "o_net.weight", (D, N * H))],
                 lambda w: w.T.reshape(N, H, w.shape[0]))
        plan.add(t + "attention.layer_norm.gamma", [plan.need(a + "layer_norm.weight", (D,))])
        plan.add(t + "attention.layer_norm.beta", [plan.need(a + "layer_norm.bias", (D,))])
        plan.add(t + "feed_forward.inner.kernel", [plan.need(f + "CoreNet.0.weight", (F, D))],
                 _transpose)
        plan.add(t + "feed_forward.inner.bias", [plan.need(f + "CoreNet.0.bias", (F,))])
        plan.add(t + "feed_forward.outer.kernel", [plan.need(f + "CoreNet.3.weight", (D, F))],
                 _transpose)
        plan.add(t + "feed_forward.outer.bias", [plan.need(f + "CoreNet.3.bias", (D,))])
        plan.add(t + "feed_forward.layer_norm.gamma", [plan.need(f + "layer_norm.weight", (D,))])
        plan.add(t + "feed_forward.layer_norm.beta", [plan.need(f + "layer_norm.bias", (D,))])

    # Relative-position biases u (r_w_bias) and v (r_r_bias).
    for name, target in (("r_w_bias", "content_bias"), ("r_r_bias", "position_bias")):
        per_layer = [f"{P}layers.{l}.dec_attn.{name}" for l in range(L)]
        if not c.untie_r:
            # HF state dicts also list the shared bias under every layer.
            shared = plan.tied(P + name, [n for n in per_layer if n in source], (N, H), "untie_r")
            plan.add(f"backbone.{target}", [shared])
        elif P + name in source or not any(n in source for n in per_layer):
            plan.add(f"backbone.{target}", [plan.need(P + name, (L, N, H))])
        else:
            plan.add(f"backbone.{target}", [plan.need(n, (N, H)) for n in per_layer],
                     lambda *xs: np.stack(xs))

    # Adaptive softmax.
    if c.div_val == 1:
        plan.add("softmax.bias", [plan.need("crit.out_layers.0.bias", (c.vocab_size,))])
        if not c.tie_weight:
            weight = plan.need("crit.out_layers.0.weight", (c.vocab_size, c.embed_dim))
            for i, cl in enumerate(clusters):
                plan.add(f"softmax.weight_{i}", [weight],
                         lambda w, s=cl.start, e=cl.end: w[s:e])
    else:
        plan.add("softmax.bias", [plan.need(f"crit.out_layers.{i}.bias", (cl.size,))
                                  for i, cl in enumerate(clusters)],
                 lambda *bs: np.concatenate(bs))
        if not c.tie_weight:
            for i, cl in enumerate(clusters):
                plan.add(f"softmax.weight_{i}",
                         [plan.need(f"crit.out_layers.{i}.weight", (cl.size, cl.dim))])
    for i, cl in enumerate(clusters):
        if cl.projected and not tie_projs[i]:
            plan.add(f"softmax.projection_{i}", [plan.need(f"crit.out_projs.{i}", (D, cl.dim))])
    if len(clusters) > 1:
        # The original PyTorch head reads cluster i at head[-i]: rows in reverse cluster order.
        order = (lambda x: x) if huggingface else (lambda x: x[::-1])
        plan.add("softmax.cluster_weight",
                 [plan.need("crit.cluster_weight", (len(clusters) - 1, c.embed_dim))], order)
        plan.add("softmax.cluster_bias",
                 [plan.need("crit.cluster_bias", (len(clusters) - 1,))], order)
    return plan


def plan_tf1(source, config):
    """Plan for an original TF1 checkpoint (`transformer/...` variables of tf/model.py)."""
    c = config
    plan = Plan(source, "tf1", config)
    plan.ignore_pattern = _TF1_IGNORED
    D, N, H, F, L = c.d_model, c.n_head, c.d_head, c.d_inner, c.n_layer
    clusters = _layout(c)
    tie_projs = c.cluster_tie_projs
    T = "transformer/"
    if not c.tie_weight:
        plan.config_problems.append("TF1 checkpoints always share the softmax weights with the "
                                    "embedding: set tie_weight=True")
    if len(clusters) == 1 and clusters[0].projected and not tie_projs[0]:
        plan.config_problems.append("without cutoffs TF1 projects the softmax with the "
                                    "embedding's proj_W: set tie_projs=[true]")

    # Embedding.
    if c.div_val == 1:
        plan.add("backbone.embedding.table_0",
                 [plan.need(T + "adaptive_embed/lookup_table", (c.vocab_size, c.embed_dim))])
        if clusters[0].projected:
            plan.add("backbone.embedding.projection_0",
                     [plan.need(T + "adaptive_embed/proj_W", (c.embed_dim, D))])
    else:
        for i, cl in enumerate(clusters):
            s = f"{T}adaptive_embed/cutoff_{i}/"
            plan.add(f"backbone.embedding.table_{i}",
                     [plan.need(s + "lookup_table", (cl.size, cl.dim))])
            if cl.projected:
                plan.add(f"backbone.embedding.projection_{i}",
                         [plan.need(s + "proj_W", (cl.dim, D))])

    # Layers: dense kernels are [in, out].
    for l in range(L):
        a, f, t = f"{T}layer_{l}/rel_attn/", f"{T}layer_{l}/ff/", f"backbone.block_{l}."
        qkv = plan.need(a + "qkv/kernel", (D, 3 * N * H))
        for part, name in enumerate(("query", "key", "value")):
            plan.add(t + f"attention.{name}_kernel", [qkv], _chunk(part, N, H, axis_out=1))
        plan.add(t + "attention.position_kernel", [plan.need(a + "r/kernel", (D, N * H))],
                 lambda w: w.reshape(D, N, H))
        plan.add(t + "attention.output_kernel", [plan.need(a + "o/kernel", (N * H, D))],
                 lambda w: w.reshape(N, H, D))
        plan.add(t + "attention.layer_norm.gamma", [plan.need(a + "LayerNorm/gamma", (D,))])
        plan.add(t + "attention.layer_norm.beta", [plan.need(a + "LayerNorm/beta", (D,))])
        plan.add(t + "feed_forward.inner.kernel", [plan.need(f + "layer_1/kernel", (D, F))])
        plan.add(t + "feed_forward.inner.bias", [plan.need(f + "layer_1/bias", (F,))])
        plan.add(t + "feed_forward.outer.kernel", [plan.need(f + "layer_2/kernel", (F, D))])
        plan.add(t + "feed_forward.outer.bias", [plan.need(f + "layer_2/bias", (D,))])
        plan.add(t + "feed_forward.layer_norm.gamma", [plan.need(f + "LayerNorm/gamma", (D,))])
        plan.add(t + "feed_forward.layer_norm.beta", [plan.need(f + "LayerNorm/beta", (D,))])

    bias_shape = (L, N, H) if c.untie_r else (N, H)
    plan.add("backbone.content_bias", [plan.need(T + "r_w_bias", bias_shape)])
    plan.add("backbone.position_bias", [plan.need(T + "r_r_bias", bias_shape)])

    # Softmax: weights tied to the embedding; own biases and (untied) projections [d_i, D].
    s = T + "adaptive_softmax/"
    if len(clusters) == 1:
        plan.add("softmax.bias", [plan.need(s + "bias", (c.vocab_size,))])
    else:
        plan.add("softmax.bias", [plan.need(f"{s}cutoff_{i}/b", (cl.size,))
                                  for i, cl in enumerate(clusters)],
                 lambda *bs: np.concatenate(bs))
        for i, cl in enumerate(clusters):
            if cl.projected and not tie_projs[i]:
                plan.add(f"softmax.projection_{i}",
                         [plan.need(f"{s}cutoff_{i}/proj", (cl.dim, D))], _transpose)
        plan.add("softmax.cluster_weight",
                 [plan.need(s + "cutoff_0/cluster_W", (len(clusters) - 1, c.embed_dim))])
        plan.add("softmax.cluster_bias", [plan.need(s + "cutoff_0/cluster_b",
                                                    (len(clusters) - 1,))])
    return plan


def make_plan(fmt, source, config):
    if fmt == "pytorch":
        return plan_pytorch(source, config, huggingface=False)
    if fmt == "huggingface":
        return plan_pytorch(source, config, huggingface=True)
    if fmt == "tf1":
        return plan_tf1(source, config)
    raise ConversionError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
