"""tfxl.convert: published checkpoint layouts -> TransfoXLLM, checked against numpy forward passes
of the original formulas on the original tensors (tests/convert_fixtures.py)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest

import tfxl
from factories import run_in_process
from convert_fixtures import (drop_tied_duplicates, hparams, pytorch_reference, pytorch_state,
                              tf1_reference, tf1_variables, write_malicious_torch_zip,
                              write_safetensors, write_tf1_checkpoint, write_torch_zip)
from tfxl.convert import (ConversionError, config_overrides_from_hf, convert_checkpoint,
                          memory_from_time_major, open_checkpoint, save_converted)

ATOL = 2e-4


def tfxl_config(hp, **extra):
    fields = {k: hp[k] for k in ("vocab_size", "n_layer", "d_model", "n_head", "d_head",
                                 "d_inner", "d_embed", "div_val", "cutoffs", "tie_weight",
                                 "tie_projs", "proj_same_dim", "untie_r", "mem_len", "tgt_len")}
    return tfxl.TransfoXLConfig(dropout=0.0, **{**fields, **extra})


def segments(hp, n=2, batch=2, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, hp["vocab_size"], size=(batch, hp["tgt_len"])) for _ in range(n)]


def model_log_probs(model, segs):
    out, memory = [], None
    for ids in segs:
        lp, memory = model(ids, memory=memory)
        out.append(np.asarray(lp))
    return out


def assert_matches(model, expected, segs):
    got = model_log_probs(model, segs)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=ATOL, rtol=0)
    # The reference is a proper distribution and the second segment used the memory.
    np.testing.assert_allclose(np.exp(expected[0]).sum(-1), 1.0, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Numerical equivalence, one case per layout family
PYTORCH_CASES = {
    # wt103-like: adaptive input, tied weights, all but the first projection tied.
    "div2_tied": dict(),
    # div_val 1 with d_embed != d_model, untied softmax weights, mixed projection ties,
    # per-layer (stacked) r biases.
    "div1_proj_untied": dict(div_val=1, d_embed=12, tie_weight=False,
                             tie_projs=(False, True, False), untie_r=True),
    # enwik8-like: no cutoffs, one table, no projection.
    "plain_softmax": dict(div_val=1, cutoffs=(), tie_projs=(False,), vocab_size=30),
}


@pytest.mark.parametrize("case", sorted(PYTORCH_CASES))
def test_pytorch_zip_matches_reference(tmp_path, case):
    hp = hparams(**PYTORCH_CASES[case])
    state = pytorch_state(hp, seed=1)
    path = tmp_path / "model.pt"
    # qkv stored as a transposed (strided) view in one layer: the reader must honour strides.
    write_torch_zip(path, state, transposed={"layers.0.dec_attn.qkv_net.weight"})
    segs = segments(hp)
    model = convert_checkpoint("pytorch", str(path), tfxl_config(hp))
    assert_matches(model, pytorch_reference(state, hp, segs), segs)


def test_pytorch_cluster_order_is_reversed_against_huggingface():
    """The same tensors read as PyTorch and as HF give different heads: the order matters."""
    hp = hparams()
    state = pytorch_state(hp, seed=2)
    segs = segments(hp, n=1)
    pt = model_log_probs(convert_checkpoint("pytorch", state, tfxl_config(hp)), segs)[0]
    np.testing.assert_allclose(pt, pytorch_reference(state, hp, segs)[0], atol=ATOL)
    hf_state = {("transformer." + k if not k.startswith("crit.") else k): v
                for k, v in state.items()}
    hf = model_log_probs(convert_checkpoint("huggingface", hf_state, tfxl_config(hp)), segs)[0]
    np.testing.assert_allclose(hf, pytorch_reference(hf_state, hp, segs, huggingface=True)[0],
                               atol=ATOL)
    assert np.abs(pt - hf).max() > 1e-2  # only the cluster rows' order differs


def test_huggingface_safetensors_deduplicated_untied_r(tmp_path):
    hp = hparams(untie_r=True)
    state = pytorch_state(hp, seed=3, huggingface=True)
    path = tmp_path / "model.safetensors"
    write_safetensors(path, drop_tied_duplicates(state))  # no crit.out_layers.*.weight etc.
    segs = segments(hp)
    model = convert_checkpoint("huggingface", str(path), tfxl_config(hp))
    assert_matches(model, pytorch_reference(state, hp, segs, huggingface=True), segs)


def test_huggingface_bin_with_shared_r_and_tied_duplicates(tmp_path):
    hp = hparams(div_val=1, d_embed=12, tie_projs=(False, True, True))
    state = pytorch_state(hp, seed=4, huggingface=True, shared_r_per_layer=True)
    path = tmp_path / "pytorch_model.bin"
    write_torch_zip(path, state)
    segs = segments(hp)
    model = convert_checkpoint("huggingface", str(path), tfxl_config(hp))
    assert_matches(model, pytorch_reference(state, hp, segs, huggingface=True), segs)


TF1_CASES = {
    # lm1b-like: div_val 4-style adaptive input without projecting the full-size cluster,
    # no projection ties, per-layer r biases.
    "lm1b_like": dict(proj_same_dim=False, tie_projs=(False, False, False), untie_r=True),
    # wt103-like with proj_same_dim (every cluster projected) and shared projections.
    "wt103_like": dict(),
    # div_val 1 with cutoffs and d_embed != d_model, mixed projection ties.
    "div1_proj": dict(div_val=1, d_embed=12, tie_projs=(False, True, False)),
    # enwik8/text8-like: no cutoffs.
    "enwik8_like": dict(div_val=1, cutoffs=(), tie_projs=(False,), vocab_size=30),
}


@pytest.mark.parametrize("case", sorted(TF1_CASES))
def test_tf1_checkpoint_matches_reference(tmp_path, case):
    hp = hparams(**TF1_CASES[case])
    variables = tf1_variables(hp, seed=5)
    prefix = write_tf1_checkpoint(tmp_path / "model.ckpt-0", variables)
    segs = segments(hp)
    model = convert_checkpoint("tf1", prefix, tfxl_config(hp, layer_norm_epsilon=1e-12))
    assert_matches(model, tf1_reference(variables, hp, segs), segs)


def test_nll_path_and_saved_model_match(tmp_path):
    hp = hparams(untie_r=True)
    state = pytorch_state(hp, seed=6)
    segs = segments(hp, n=1)
    model = convert_checkpoint("pytorch", state, tfxl_config(hp))
    keras_path, config_path = save_converted(model, tmp_path / "out.keras")
    assert json.load(open(config_path)) == model.config.to_dict()
    loaded = keras.saving.load_model(keras_path)
    expected = pytorch_reference(state, hp, segs)[0]
    np.testing.assert_allclose(model_log_probs(loaded, segs)[0], expected, atol=ATOL)
    targets = (segs[0] + 1) % hp["vocab_size"]
    nll, _ = loaded(segs[0], targets=targets)
    want = -np.take_along_axis(expected, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(nll), want, atol=ATOL)
    with pytest.raises(ConversionError, match="exists"):
        save_converted(model, keras_path)


def test_memory_from_time_major_matches_own_memory():
    hp = hparams()
    state = pytorch_state(hp, seed=8)
    model = convert_checkpoint("pytorch", state, tfxl_config(hp))
    segs = segments(hp, n=2)
    _, memory = model(segs[0])
    # Re-express the memory time-major (as the reference's mems) and convert it back.
    states, valid = np.asarray(memory.states), np.asarray(memory.valid)
    assert valid[:, -hp["tgt_len"]:].all() and not valid[:, 0].any()
    mems = [states[:, l, -hp["tgt_len"]:].transpose(1, 0, 2) for l in range(hp["n_layer"])]
    rebuilt = memory_from_time_major(mems, hp["n_layer"], mem_len=hp["mem_len"])
    np.testing.assert_array_equal(rebuilt.valid, valid)
    a, _ = model(segs[1], memory=memory)
    b, _ = model(segs[1], memory=rebuilt)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


# ------------------------------------------------------------------------------------------------
# Errors
def test_missing_unknown_and_misshaped_listed_together():
    hp = hparams()
    state = dict(pytorch_state(hp))
    del state["layers.1.dec_attn.r_net.weight"]
    del state["crit.cluster_bias"]
    state["layers.0.dec_attn.extra"] = np.zeros(3, np.float32)
    state["layers.0.pos_ff.CoreNet.0.weight"] = np.zeros((5, 16), np.float32)
    with pytest.raises(ConversionError) as info:
        convert_checkpoint("pytorch", state, tfxl_config(hp))
    message = str(info.value)
    assert "\n" not in message
    for name in ("layers.1.dec_attn.r_net.weight", "crit.cluster_bias",
                 "layers.0.dec_attn.extra", "layers.0.pos_ff.CoreNet.0.weight (expected [24, 16], "
                 "found [5, 16])"):
        assert name in message
    assert "missing 2" in message and "unknown 1" in message and "1 shape mismatch" in message


def test_wrong_config_and_format_hints():
    hp = hparams()
    state = pytorch_state(hp)
    with pytest.raises(ConversionError, match="untie_r"):
        convert_checkpoint("pytorch", state, tfxl_config(hp, untie_r=True))
    with pytest.raises(ConversionError, match="proj_same_dim=True"):
        convert_checkpoint("pytorch", state, tfxl_config(hp, proj_same_dim=False,
                                                         tie_projs=(False, False, True)))
    with pytest.raises(ConversionError, match="--format=huggingface"):
        convert_checkpoint("pytorch", {"transformer." + k: v for k, v in state.items()},
                           tfxl_config(hp))
    with pytest.raises(ConversionError, match="tie_weight=True"):
        convert_checkpoint("tf1", tf1_variables(hp, with_optimizer=False),
                           tfxl_config(hp, tie_weight=False))


def test_tied_tensors_that_differ_are_refused():
    hp = hparams()
    state = dict(pytorch_state(hp))
    state["crit.out_projs.1"] = state["crit.out_projs.1"] + 1.0  # no longer the embedding's
    with pytest.raises(ConversionError, match=r"crit.out_projs.1.*tie_projs"):
        convert_checkpoint("pytorch", state, tfxl_config(hp))
    # ... and the same file converts with the projection untied.
    convert_checkpoint("pytorch", state, tfxl_config(hp, tie_projs=(False, False, True)))


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    write_malicious_torch_zip(path, marker)
    with pytest.raises(ConversionError, match=r"refusing to unpickle global os\.system"):
        open_checkpoint(path)
    assert not marker.exists()


def test_torch_reader_half_precision_and_bad_files(tmp_path):
    half = np.arange(6, dtype=np.float16).reshape(2, 3) / 4
    write_torch_zip(tmp_path / "h.pt", {"a": half, "b": np.arange(4, dtype=np.int64)})
    source = open_checkpoint(tmp_path / "h.pt")
    assert source.shapes == {"a": (2, 3), "b": (4,)}
    np.testing.assert_array_equal(source.get("a"), half)
    np.testing.assert_array_equal(source.get("b"), np.arange(4))
    (tmp_path / "legacy.pt").write_bytes(b"\x80\x02\x8a\x0alegacy torch file")
    with pytest.raises(ConversionError, match="not a torch zip"):
        open_checkpoint(tmp_path / "legacy.pt")
    # A storage too small for the tensor geometry claimed by the pickle.
    write_torch_zip(tmp_path / "short.pt", {"a": np.zeros((4, 4), np.float32)})
    with zipfile.ZipFile(tmp_path / "short.pt") as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["archive/data/0"] = members["archive/data/0"][:16]
    with zipfile.ZipFile(tmp_path / "short.pt", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(ConversionError, match="storage 0"):
        open_checkpoint(tmp_path / "short.pt").get("a")
    # A negative stride (or offset) is refused naming the file and the tensor.
    write_torch_zip(tmp_path / "negative.pt", {"w": np.zeros((258, 64), np.float32)},
                    strides={"w": (-64, 1)})
    with pytest.raises(ConversionError, match=r"negative.pt: tensor 'w': bad tensor geometry "
                                              r"size=\(258, 64\) stride=\(-64, 1\)"):
        open_checkpoint(tmp_path / "negative.pt")


def test_a_storage_larger_than_its_tensors_is_refused_before_it_is_inflated(tmp_path):
    """A 64 KiB tensor whose deflated storage inflates to 256 MiB: the
    zip directory's declared size is checked against the tensor, and nothing is inflated."""
    import tracemalloc
    path = tmp_path / "bomb.pt"
    write_torch_zip(path, {"decoder.weight": np.zeros((128, 128), np.float32)})
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            if name != "archive/data/0":
                z.writestr(name, data)
        with z.open("archive/data/0", "w") as storage:
            for _ in range(64):
                storage.write(bytes(4 << 20))
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ConversionError) as refused:
            open_checkpoint(path).get("decoder.weight")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(refused.value) == (
        f"{path}: storage 0 declares {256 << 20} bytes but the tensors on it need 65536 "
        "(tensor 'decoder.weight' [128, 128]); refusing to inflate it")
    assert peak < 8 << 20


def test_safetensors_bfloat16_damaged_files_and_missing_package(tmp_path, monkeypatch,
                                                                  capsys):
    import ml_dtypes
    values = np.array([[1.5, -2.0], [3.0, 0.25]], np.float32)  # exact in bfloat16
    write_safetensors(tmp_path / "ok.safetensors",
                      {"x": values, "y": values.astype(ml_dtypes.bfloat16)})
    source = open_checkpoint(tmp_path / "ok.safetensors")
    assert source.shapes == {"x": (2, 2), "y": (2, 2)}
    np.testing.assert_array_equal(source.get("x"), values)
    widened = source.get("y")
    assert widened.dtype == np.float32  # bfloat16 read as float32
    np.testing.assert_array_equal(widened, values)
    data = (tmp_path / "ok.safetensors").read_bytes()
    for name, content in (("cut", data[:-4]), ("junk", b"\xff" * 16), ("short", b"\x01")):
        (tmp_path / f"{name}.safetensors").write_bytes(content)
        with pytest.raises(ConversionError, match=f"{name}.safetensors: not a valid safetensors "
                           "file") as error:
            open_checkpoint(tmp_path / f"{name}.safetensors")
        assert "\n" not in str(error.value)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # as if not installed
    with pytest.raises(ConversionError, match=r"ok.safetensors: reading .safetensors files needs "
                       r"the safetensors package: pip install '\.\[convert\]' in a clone of tfxl"):
        open_checkpoint(tmp_path / "ok.safetensors")
    out = tmp_path / "x.keras"
    assert _cli(["--format=huggingface", f"--input={tmp_path / 'ok.safetensors'}",
                 f"--output={out}", "--preset=tiny"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "pip install '.[convert]' in a clone of tfxl" in errors[0], errors
    assert not out.exists()


def test_hf_config_translation():
    hf = {"n_token": 267735, "cutoffs": [20000, 40000, 200000], "d_model": 1024, "d_embed": 1024,
          "n_head": 16, "d_head": 64, "d_inner": 4096, "div_val": 4, "n_layer": 18,
          "mem_len": 1600, "clamp_len": 1000, "same_length": True, "tgt_len": 128,
          "proj_share_all_but_first": True, "attn_type": 0, "untie_r": True, "tie_weight": True,
          "pre_lnorm": False, "dropout": 0.1, "dropatt": 0.0}
    config = tfxl.get_preset("wt103_large", **config_overrides_from_hf(hf))
    assert config.tie_projs == (False, True, True, True) and config.vocab_size == 267735
    assert config.eval_settings() == dict(tgt_len=128, mem_len=1600, clamp_len=1000,
                                          same_length=True)
    assert config_overrides_from_hf({"clamp_len": 0})["clamp_len"] == -1
    with pytest.raises(ConversionError, match="attn_type"):
        config_overrides_from_hf({"attn_type": 2})


# ------------------------------------------------------------------------------------------------
# CLI
def _cli(argv):
    """tfxl-convert run in this process (`factories.run_in_process`, which leaves no flag
    defined behind): its exit status; what it printed goes to this test's stdout and stderr."""
    result = run_in_process("tfxl.convert.main", *argv)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


def test_cli_huggingface_directory_and_overwrite(tmp_path, capsys):
    hp = hparams(untie_r=True)
    state = pytorch_state(hp, seed=9, huggingface=True)
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    write_safetensors(hf_dir / "model.safetensors", drop_tied_duplicates(state))
    (hf_dir / "config.json").write_text(json.dumps(dict(
        vocab_size=40, cutoffs=[10, 25], d_model=16, d_embed=16, n_head=2, d_head=4,
        d_inner=24, div_val=2, n_layer=2, mem_len=6, tgt_len=5, clamp_len=0,
        same_length=False, proj_share_all_but_first=True, untie_r=True,
        tie_word_embeddings=True, attn_type=0)))
    out = tmp_path / "conv.keras"
    assert _cli(["--format=huggingface", f"--input={hf_dir}", f"--output={out}"]) == 0
    config = tfxl.TransfoXLConfig.from_json((tmp_path / "conv.config.json").read_text())
    assert config.tie_projs == (False, True, True) and config.untie_r
    segs = segments(hp)
    assert_matches(keras.saving.load_model(out), pytorch_reference(state, hp, segs,
                                                                   huggingface=True), segs)
    capsys.readouterr()
    assert _cli(["--format=huggingface", f"--input={hf_dir}", f"--output={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "--overwrite" in err[-1] and len(err) == 1
    assert _cli(["--format=huggingface", f"--input={hf_dir}", f"--output={out}",
                 "--overwrite"]) == 0


def test_cli_tf1_preset_overrides_and_bad_input(tmp_path, capsys):
    hp = hparams(proj_same_dim=False, tie_projs=(False, False, False), untie_r=True)
    prefix = write_tf1_checkpoint(tmp_path / "model.ckpt-0", tf1_variables(hp))
    out = tmp_path / "tf1.keras"
    flags_ = ["--format=tf1", f"--input={prefix}", f"--output={out}", "--preset=lm1b_base",
              "--vocab_size=40", "--n_layer=2", "--d_model=16", "--n_head=2", "--d_head=4",
              "--d_inner=24", "--d_embed=16", "--div_val=2", "--cutoffs=10,25",
              "--noproj_same_dim", "--tie_projs=false,false,false", "--tgt_len=5",
              "--mem_len=6"]
    # Wrong shapes: one error line listing the mismatches, exit 2, nothing written.
    assert _cli(flags_[:-2] + ["--d_inner=32", "--tgt_len=5", "--mem_len=6"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([e for e in err if e.startswith("error:")]) == 1
    assert "layer_1/kernel (expected [16, 32], found [16, 24])" in err[-1]
    assert not out.exists()
    assert _cli(flags_) == 0
    config = tfxl.TransfoXLConfig.from_json((tmp_path / "tf1.config.json").read_text())
    assert config.layer_norm_epsilon == 1e-12 and config.eval_mem_len == 128
    segs = segments(hp)
    assert_matches(keras.saving.load_model(out), tf1_reference(tf1_variables(hp), hp, segs), segs)
    for bad in (["--format=pytorch", f"--input={tmp_path / 'nope.pt'}",
                 f"--output={tmp_path / 'x.keras'}", "--preset=tiny"],
                ["--format=tf1", f"--input={prefix}", f"--output={tmp_path / 'x.h5'}",
                 "--preset=tiny"],
                ["--format=tf1", f"--input={prefix}", f"--output={tmp_path / 'x.keras'}"]):
        assert _cli(bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ")


@pytest.mark.large
@pytest.mark.subprocess
def test_cli_subprocess_flag_error_exits_2(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-m", "tfxl.convert.main", "--format=onnx"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "onnx" in lines[0]


def test_tied_tensor_found_under_softmax_name_and_npz(tmp_path):
    """Only the softmax alias of a tied tensor present (the other name dropped), read from .npz."""
    hp = hparams(div_val=1, d_embed=12, tie_projs=(True, True, False))
    state = pytorch_state(hp, seed=10)
    kept = {k: v for k, v in state.items()
            if k not in ("word_emb.emb_layers.0.weight", "word_emb.emb_projs.0")}
    assert "crit.out_layers.0.weight" in kept and "crit.out_projs.0" in kept
    np.savez(tmp_path / "state.npz", **kept)
    segs = segments(hp)
    model = convert_checkpoint("pytorch", str(tmp_path / "state.npz"), tfxl_config(hp))
    assert_matches(model, pytorch_reference(state, hp, segs), segs)


# ------------------------------------------------------------------------------------------------
# Files: permissions, and checkpoints and outputs in a bucket
def test_outputs_are_readable_by_others_and_replaced_only_with_overwrite(tmp_path):
    old_umask = os.umask(0o022)
    try:
        model = convert_checkpoint("pytorch", pytorch_state(hparams()), tfxl_config(hparams()))
        out = tmp_path / "m.keras"
        save_converted(model, out)
        for path in (out, tmp_path / "m.config.json"):
            assert os.stat(path).st_mode & 0o777 == 0o644, path  # not mkstemp's 0600
        with pytest.raises(ConversionError, match="--overwrite"):
            save_converted(model, out)
        save_converted(model, out, overwrite=True)
        assert sorted(os.listdir(tmp_path)) == ["m.config.json", "m.keras"]  # no temporaries
    finally:
        os.umask(old_umask)


def test_checkpoints_and_outputs_in_a_bucket_go_through_gfile(tmp_path, monkeypatch):
    """ram:// (TensorFlow's in-memory file system) stands for a bucket: a Hugging Face directory,
    a torch zip and an .npz there are converted into a .keras file there; no local folder named
    like the bucket appears, and the local copy of a remote checkpoint goes with its source."""
    import gc
    import tensorflow as tf
    monkeypatch.chdir(tmp_path)
    bucket = "ram://convert-test"
    hp = hparams(untie_r=True)
    state = pytorch_state(hp, seed=9, huggingface=True)
    write_safetensors(tmp_path / "model.safetensors", drop_tied_duplicates(state))
    (tmp_path / "config.json").write_text(json.dumps(dict(
        vocab_size=40, cutoffs=[10, 25], d_model=16, d_embed=16, n_head=2, d_head=4,
        d_inner=24, div_val=2, n_layer=2, mem_len=6, tgt_len=5, clamp_len=0,
        same_length=False, proj_share_all_but_first=True, untie_r=True,
        tie_word_embeddings=True, attn_type=0)))
    for name in ("model.safetensors", "config.json"):
        tf.io.gfile.copy(str(tmp_path / name), f"{bucket}/hf/{name}")
    out = f"{bucket}/out/conv.keras"
    assert _cli(["--format=huggingface", f"--input={bucket}/hf", f"--output={out}"]) == 0
    segs = segments(hp)
    assert_matches(keras.saving.load_model(out),
                   pytorch_reference(state, hp, segs, huggingface=True), segs)
    with tf.io.gfile.GFile(f"{bucket}/out/conv.config.json") as f:
        assert tfxl.TransfoXLConfig.from_json(f.read()).untie_r
    assert _cli(["--format=huggingface", f"--input={bucket}/hf", f"--output={out}"]) == 2

    plain = hparams()
    plain_state = pytorch_state(plain)
    write_torch_zip(tmp_path / "state.pt", plain_state)
    np.savez(tmp_path / "state.npz", **plain_state)
    for name in ("state.pt", "state.npz"):
        tf.io.gfile.copy(str(tmp_path / name), f"{bucket}/{name}")
        source = open_checkpoint(f"{bucket}/{name}")
        assert source.description.endswith(f"{bucket}/{name}")  # named as the user named it
        copy = source.local_copy.name
        np.testing.assert_array_equal(source.get("word_emb.emb_layers.0.weight"),
                                      plain_state["word_emb.emb_layers.0.weight"])
        del source
        gc.collect()
        assert not os.path.exists(copy)
    model = convert_checkpoint("pytorch", f"{bucket}/state.pt", tfxl_config(plain))
    save_converted(model, f"{bucket}/plain.keras")
    assert_matches(keras.saving.load_model(f"{bucket}/plain.keras"),
                   pytorch_reference(plain_state, plain, segs), segs)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors", "state.npz",
                                            "state.pt"]


def test_an_input_directory_is_named_as_one(tmp_path, capsys):
    output = tmp_path / "x.keras"
    assert _cli(["--format=pytorch", f"--input={tmp_path}", f"--output={output}",
                 "--preset=tiny"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --input={tmp_path} is a directory; --format=pytorch reads one file (a torch zip "
        ".bin/.pt, .safetensors or .npz)")
    assert not output.exists()
    with pytest.raises(ConversionError, match=f"^{tmp_path} is a directory, not a torch "):
        open_checkpoint(tmp_path, "torch")


def test_a_mismatch_is_one_short_line_and_listed_whole_with_verbosity_1(tmp_path, capsys):
    hp = hparams()
    checkpoint = tmp_path / "model.pt"
    write_torch_zip(checkpoint, pytorch_state(hp))
    config = tmp_path / "deeper.json"
    config.write_text(tfxl_config(hp, n_layer=40).to_json())  # 38 layers the file lacks
    argv = ["--format=pytorch", f"--input={checkpoint}", f"--output={tmp_path / 'x.keras'}",
            f"--config={config}"]
    assert _cli(argv) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and len(error[0]) < 1000, error
    missing = int(re.search(r"missing (\d+) tensor\(s\): ", error[0]).group(1))
    assert missing > 300 and f"and {missing - 5} more" in error[0]
    assert error[0].endswith("(--verbosity=1 lists every tensor)")
    assert _cli([*argv, "--verbosity=1"]) == 2
    listed = capsys.readouterr().err.splitlines()
    start = listed.index(f"missing {missing} tensor(s):") + 1
    assert all(line.startswith("  layers.") for line in listed[start:start + missing])
    assert listed[-1] == error[0]


def _npz_with_header(path, members):
    """An .npz (a zip) of `members`: name -> bytes, written as they are."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _npy_header(shape, dtype="<f4"):
    import io
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False,
                                                  "shape": shape})
    return buffer.getvalue()


def test_npz_shapes_come_from_the_headers_and_lying_members_are_one_error_line(tmp_path,
                                                                            capsys):
    """The .npz reader learns each array's shape from its .npy header, loading nothing: a header
    claiming 10^12 elements over a few bytes is refused naming the member, not a 3.64 TiB
    allocation; a member that is not .npy is one line, not an AttributeError on bytes."""
    from tfxl.convert.readers import read_npz
    good = tmp_path / "good.npz"
    np.savez(good, a=np.arange(6, dtype=np.float32).reshape(2, 3), b=np.zeros(4, np.int64))
    source = read_npz(str(good))
    assert source.shapes == {"a": (2, 3), "b": (4,)}
    np.testing.assert_array_equal(source.get("a"), np.arange(6).reshape(2, 3))

    huge = tmp_path / "huge.npz"
    _npz_with_header(huge, {"w.npy": _npy_header((10**6, 10**6)) + b"\0" * 64})
    with pytest.raises(ConversionError, match=r"huge.npz: w.npy declares shape \(1000000, "
                       r"1000000\) float32, 4000000000000 bytes, but holds 64"):
        read_npz(str(huge))
    other = tmp_path / "other.npz"
    _npz_with_header(other, {"a.npy": _npy_header((1,)) + b"\0" * 4, "notes.txt": b"hello"})
    with pytest.raises(ConversionError, match=r"other.npz: member 'notes.txt' is not a .npy "
                       r"array"):
        read_npz(str(other))
    garbled = tmp_path / "garbled.npz"
    _npz_with_header(garbled, {"a.npy": b"not an array at all"})
    with pytest.raises(ConversionError, match=r"garbled.npz: a.npy is not a .npy array"):
        read_npz(str(garbled))
    argv = ["--format=pytorch", f"--input={huge}", f"--output={tmp_path / 'x.keras'}",
            "--preset=tiny"]
    assert _cli(argv) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "w.npy declares shape" in error[0], error
    assert not os.path.exists(tmp_path / "x.keras")


@pytest.mark.parametrize("changes,cause", [
    (dict(d_model=32, d_embed=32), r"the config's d_model, d_embed 32 is 16 in the checkpoint"),
    (dict(n_head=4), r"the config's n_head(, d_head)? 4 is 2 in the checkpoint"),
    (dict(n_layer=40), r"the checkpoint has 2 layers, the config's n_layer 40"),
    (dict(d_head=8, n_layer=3), r"the checkpoint has 2 layers, the config's n_layer 3; .*the "
                                r"config's d_head 8 is 4 in the checkpoint"),
])
def test_a_config_of_another_size_is_hinted_as_its_size_not_untie_r(changes, cause):
    """When most tensors differ in a dimension or in number, the hint names the config's size
    (d_model, n_head, n_layer, ...) whose value the checkpoint's shapes contradict, first; the
    untie_r hint only when the r biases differ in layout (name or rank), not in size."""
    hp = hparams()
    state = pytorch_state(hp)
    with pytest.raises(ConversionError) as error:
        convert_checkpoint("pytorch", state, tfxl_config(hp, **changes))
    hint = str(error.value).split(". Hint: ", 1)[1]
    assert re.search(r"^the config's size differs from the checkpoint's: .*" + cause, hint), hint
    assert "untie_r" not in hint, hint


def test_the_mismatch_line_docs_convert_shows_is_the_one_printed(tmp_path, capsys):
    """docs/convert.md shows the mismatch refusal as printed: counts, 5 names a kind, `and N
    more`, the size hint first, and the full list only with --verbosity=1 (it promised the
    full list in the line)."""
    shape = re.compile(r"^error: .+ does not match the config \(\w+\): (missing |unknown )?"
                       r"\d+ [^:]+: .+ and \d+ more\. Hint: the config's size differs from "
                       r"the checkpoint's: .+ \(--verbosity=1 lists every tensor\)$")
    checkpoint = tmp_path / "model.pt"
    hp = hparams()
    write_torch_zip(checkpoint, pytorch_state(hp))
    config = tmp_path / "deeper.json"
    config.write_text(tfxl_config(hp, n_layer=40).to_json())
    assert _cli(["--format=pytorch", f"--input={checkpoint}", f"--output={tmp_path / 'x.keras'}",
                 f"--config={config}"]) == 2
    printed = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert shape.match(printed[0]), printed
    docs = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "convert.md").read_text()
    documented = [line for line in docs.splitlines()
                  if line.startswith("error:") and "does not match the config" in line]
    assert documented and all(shape.match(line) for line in documented), documented
    assert "--verbosity=1` prints the full list" in " ".join(docs.split())
