"""tfxl.layers and the language model on JAX and on PyTorch, in a process where TensorFlow
cannot be imported: they import, and give TensorFlow's numbers on the same weights.

(The model tests themselves run on every backend: `make test` runs the modules marked
`every_backend` again under KERAS_BACKEND=jax and =torch.)
"""

import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from backends import JAX_XLA_FLAGS, WITHOUT_TENSORFLOW, to_numpy
from factories import tiny_lm
from tfxl.layers import AdaptiveSoftmax, TransformerXLBlock, attention_mask
from tfxl.models.scoring import score_document

pytestmark = [pytest.mark.large, pytest.mark.subprocess]

# The child: loads what the parent saved under TensorFlow and writes its outputs.
ON_ANOTHER_BACKEND = WITHOUT_TENSORFLOW + """
import keras, numpy as np
import tfxl.models
from tfxl.models.scoring import score_document
assert keras.backend.backend() == sys.argv[1], keras.backend.backend()
work = sys.argv[2]

# The functional model of a block and the adaptive softmax.
layers = keras.saving.load_model(f"{work}/layers.keras")
inputs = np.load(f"{work}/layers_inputs.npz")
outputs = layers([inputs[f"input_{i}"] for i in range(len(inputs.files))])
np.savez(f"{work}/layers_outputs.npz", *[keras.ops.convert_to_numpy(x) for x in outputs])

# The language model.
model = keras.saving.load_model(f"{work}/lm.keras")
inputs = np.load(f"{work}/lm_inputs.npz")
segments = inputs["segments"]
outputs = {}
for kind, memory in (("layer_input", model.init_memory(segments.shape[1])),
                     ("key_value", model.init_key_value_memory(segments.shape[1]))):
    for i, segment in enumerate(segments):
        nll, memory = model(segment[:, :-1], memory, targets=segment[:, 1:])
        outputs[f"{kind}_{i}"] = keras.ops.convert_to_numpy(nll)
outputs["document"] = keras.ops.convert_to_numpy(score_document(model, inputs["document"])[0])
outputs["generated"] = model.generate(inputs["prompt"], GENERATE["n"], **GENERATE["sampling"])
# The stateful model's fit on the same weights (learning rate 0): the first segment's NLL.
stateful = tfxl.models.StatefulTransfoXLLM(model.config, batch_size=segments.shape[1])
stateful.lm.set_weights(model.get_weights())
stateful.compile(keras.optimizers.SGD(0.0))
outputs["stateful_fit"] = np.array(stateful.fit(segments[0, :, :-1], segments[0, :, 1:],
                                                verbose=0).history["loss"])
import tfxl.hub  # its models need no TensorFlow; its tokenizer says it does
try:
    tfxl.hub.TransfoXLTokenizer({"type": "bytes"})
except ImportError as error:
    assert "tfxl.hub.TransfoXLTokenizer needs TensorFlow" in str(error), error
else:
    raise AssertionError("TransfoXLTokenizer without TensorFlow")
np.savez(f"{work}/lm_outputs.npz", **outputs)
"""

B, T, M, D, N, H, V = 2, 5, 3, 16, 2, 8, 40
# 40 sampled tokens: the recent window (32 slots) merges once.
GENERATE = dict(n=40, sampling=dict(temperature=1.0, top_k=20, top_p=0.95, seed=-12345))
ON_ANOTHER_BACKEND = ON_ANOTHER_BACKEND.replace("GENERATE", repr(GENERATE))


@pytest.fixture(scope="module")
def on_tensorflow(tmp_path_factory):
    """The two models saved as .keras files under TensorFlow, their inputs, and TensorFlow's
    outputs: (folder, {"layers": [outputs], "lm": {name: output}})."""
    work = tmp_path_factory.mktemp("on_tensorflow")
    return work, {"layers": layers_on_tensorflow(work), "lm": language_model_on_tensorflow(work)}


def layers_on_tensorflow(work):
    """A functional model of a Transformer-XL block on a memory (layer inputs) and the adaptive
    softmax's NLL (tail clusters: TensorFlow's sparse path here, the static one elsewhere)."""
    rng = np.random.default_rng(0)
    block = TransformerXLBlock(D, N, H, 24, init_std=0.3)
    softmax = AdaptiveSoftmax(V, D, D, cutoffs=(10, 25), div_val=2, init_std=0.3)
    arrays = [rng.normal(size=(B, T, D)).astype(np.float32),
              rng.normal(size=(B, M, D)).astype(np.float32),
              rng.normal(size=(N, H, M + T + 1)).astype(np.float32),
              to_numpy(attention_mask(rng.random((B, M)) > 0.3, T)),
              *(rng.normal(size=(2, N, H)).astype(np.float32) * 0.3),
              rng.integers(0, V, (B, T)).astype(np.int32)]
    inputs = [keras.Input(batch_shape=x.shape, dtype=keras.backend.standardize_dtype(x.dtype))
              for x in arrays]
    hidden, _ = block(*inputs[:6])
    model = keras.Model(inputs, [hidden, softmax(hidden, inputs[6])])
    model.save(work / "layers.keras")
    np.savez(work / "layers_inputs.npz", **{f"input_{i}": x for i, x in enumerate(arrays)})
    return [to_numpy(x) for x in model(arrays)]


def language_model_on_tensorflow(work):
    """A language model with tail clusters and tied weights: three segments on each memory
    (layer inputs, keys and values; M = 6 > T = 4), a whole document (`score_document`),
    `generate` with a seed, and the stateful model's first loss (the first segment's NLL)."""
    model = tiny_lm(vocab_size=V, d_model=D, d_head=H, n_head=N, d_embed=D, cutoffs=(10, 25),
                    div_val=2, tie_weight=True, tgt_len=4, mem_len=6, eval_mem_len=6,
                    init_std=0.3)
    segments = np.random.default_rng(1).integers(0, V, (3, B, 5)).astype(np.int32)
    want = {}
    for kind, memory in (("layer_input", model.init_memory(B)),
                         ("key_value", model.init_key_value_memory(B))):
        for i, segment in enumerate(segments):
            nll, memory = model(segment[:, :-1], memory, targets=segment[:, 1:])
            want[f"{kind}_{i}"] = to_numpy(nll)
    rng = np.random.default_rng(2)
    document, prompt = rng.integers(0, V, (B, 12)), rng.integers(0, V, (B, 3))
    want["document"] = to_numpy(score_document(model, document)[0])
    want["generated"] = model.generate(prompt, GENERATE["n"], **GENERATE["sampling"])
    want["stateful_fit"] = np.array([want["layer_input_0"].mean()])
    model.save(work / "lm.keras")
    np.savez(work / "lm_inputs.npz", segments=segments, document=document, prompt=prompt)
    return want


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_layers_and_the_language_model_run_without_tensorflow_and_agree_with_it(
        on_tensorflow, tmp_path, backend):
    """Both models, loaded from their .keras files on JAX and on PyTorch in a process where
    TensorFlow cannot be imported, give TensorFlow's outputs to 1e-5 (the block, the softmax's
    NLL, each segment on each memory, the document), `generate` samples TensorFlow's tokens
    (one random stream on every backend) and the stateful model's fit gives TensorFlow's NLL;
    tfxl.hub imports, and its tokenizer says it needs TensorFlow."""
    saved, want = on_tensorflow
    work = tmp_path / "work"
    shutil.copytree(saved, work)
    env = {**os.environ, "KERAS_BACKEND": backend, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": JAX_XLA_FLAGS}
    done = subprocess.run([sys.executable, "-c", ON_ANOTHER_BACKEND, backend, str(work)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    got = np.load(work / "layers_outputs.npz")
    for i, expected in enumerate(want["layers"]):
        np.testing.assert_allclose(got[f"arr_{i}"], expected, atol=1e-5, rtol=1e-5)
    got, expected = np.load(work / "lm_outputs.npz"), dict(want["lm"])
    assert sorted(got.files) == sorted(expected)
    np.testing.assert_array_equal(got["generated"], expected.pop("generated"))
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=1e-5, rtol=1e-5, err_msg=name)
