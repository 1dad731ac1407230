"""JAX runs that cannot start (tfxl/tpu/jax_mesh.py): a --jax_coordinator without a port, a
coordinator host that does not resolve, a peer that never joins, a platform whose runtime does
not start. Each is one `error:` line, exit status 2, no traceback and no model_dir, within
--jax_join_timeout; --jax_coordinator=auto on one machine is one process."""

import os
import subprocess
import sys
import time

import pytest

import factories
from factories import free_port
from tfxl.tpu import jax_mesh
from tfxl.tpu.strategy import StrategyError

JOIN_TIMEOUT = 3   # --jax_join_timeout of the subprocess tests, seconds
TOOL_SECONDS = 120  # what a refused run may take on a loaded 2-core machine, start-up included


# -- the checks before JAX is asked ----------------------------------------------------------------

@pytest.mark.parametrize("coordinator, needle", [
    ("localhost", "--jax_coordinator=localhost has no port: give process 0's host:port"),
    ("[::1]", "has no port"),
    (":1234", "has no port"),
    ("host:abc", "the port 'abc' is not a number in [1, 65535]"),
    ("host:70000", "the port '70000' is not a number"),
])
def test_a_coordinator_without_a_port_is_refused_before_jax_is_asked(coordinator, needle):
    with pytest.raises(StrategyError) as raised:
        jax_mesh.initialize_processes(coordinator, 2, 0)
    assert needle in str(raised.value)


def test_a_coordinators_host_and_port():
    assert jax_mesh.coordinator_host_port("10.0.0.1:1234") == ("10.0.0.1", 1234)
    assert jax_mesh.coordinator_host_port("[::1]:80") == ("::1", 80)
    assert jax_mesh.coordinator_host_port("host0.pod:8476") == ("host0.pod", 8476)


def test_what_a_process_whose_join_timed_out_says():
    assert jax_mesh._not_joined("h:1", 2, 0, 3).startswith(
        "--jax_coordinator=h:1: process 1 of --jax_processes=2 did not join process 0 within "
        "3 s (--jax_join_timeout)")
    assert "at least one of processes 1 to 3 of --jax_processes=4" in jax_mesh._not_joined(
        "h:1", 4, 0, 3)
    nobody = f"127.0.0.1:{free_port()}"
    assert jax_mesh._not_joined(nobody, 2, 1, 3).startswith(
        f"--jax_coordinator={nobody}: process 0 (the coordinator) did not answer there")


def test_a_platform_that_does_not_start_is_a_strategy_error(monkeypatch):
    import jax

    def devices():
        raise RuntimeError("Unable to initialize backend 'tpu': INTERNAL: Failed to open "
                           "libtpu.so (set JAX_PLATFORMS='' to automatically choose an "
                           "available backend)")
    monkeypatch.setattr(jax, "devices", devices)
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    with pytest.raises(StrategyError, match=r"^JAX_PLATFORMS=tpu: JAX could not start it "
                                            r"\(Unable to initialize backend 'tpu': .*libtpu.so\); "
                                            r".*JAX_PLATFORMS=cpu"):
        jax_mesh.local_devices_or_error()


# -- tfxl-train ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return factories.random_bytes_data(tmp_path_factory.mktemp("join"), 8, 4)


def train(data_dir, model_dir, *flags, platforms="cpu"):
    env = {**{k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TF_CONFIG")},
           "KERAS_BACKEND": "jax", "JAX_PLATFORMS": platforms, "CUDA_VISIBLE_DEVICES": "",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tfxl.train.main", f"--data_dir={data_dir}",
         f"--model_dir={model_dir}", "--train_batch_size=4", "--tgt_len=8", "--mem_len=8",
         "--train_steps=2", "--lease_settle=0", *flags],
        env=env, capture_output=True, text=True, timeout=TOOL_SECONDS)
    return result, time.monotonic() - started


@pytest.mark.large
@pytest.mark.subprocess
@pytest.mark.parametrize("flags, needles", [
    (["--jax_coordinator=localhost", "--jax_processes=2", "--jax_process_id=0"],
     ["--jax_coordinator=localhost has no port"]),
    (["--jax_coordinator=nohost.invalid:1234", "--jax_processes=2", "--jax_process_id=1"],
     ["the host 'nohost.invalid' did not resolve within 3 s (--jax_join_timeout)"]),
    (["--jax_processes=2", "--jax_process_id=0"],
     ["process 1 of --jax_processes=2 did not join process 0 within 3 s (--jax_join_timeout)"]),
    (["--jax_processes=2", "--jax_process_id=1"],
     ["process 0 (the coordinator) did not answer there within 3 s"]),
], ids=["no-port", "unresolvable-host", "missing-peer", "missing-coordinator"])
def test_a_jax_run_that_cannot_join_is_one_line_within_its_timeout(data_dir, tmp_path, flags,
                                                                     needles):
    if not any(flag.startswith("--jax_coordinator") for flag in flags):
        flags = [f"--jax_coordinator=127.0.0.1:{free_port()}", *flags]
    result, seconds = train(data_dir, tmp_path / "m", *flags,
                            f"--jax_join_timeout={JOIN_TIMEOUT}")
    factories.assert_one_error_line(result, *needles)
    assert "Connecting to JAX distributed service" not in result.stderr
    assert not (tmp_path / "m").exists()
    # JAX's own deadline (an abort) is JAX_DEADLINE_MARGIN later: the line comes first.
    assert seconds < JOIN_TIMEOUT + jax_mesh.JAX_DEADLINE_MARGIN, seconds


@pytest.mark.large
@pytest.mark.subprocess
def test_a_platform_without_its_runtime_is_one_line(data_dir, tmp_path):
    result, _ = train(data_dir, tmp_path / "m", platforms="tpu")
    factories.assert_one_error_line(result, "JAX_PLATFORMS=tpu: JAX could not start it")
    assert not (tmp_path / "m").exists()


@pytest.mark.large
@pytest.mark.subprocess
def test_auto_on_one_machine_is_one_process(data_dir, tmp_path):
    result, _ = train(data_dir, tmp_path / "m", "--jax_coordinator=auto", "--dry_run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--jax_coordinator=auto: JAX finds no cluster here" in result.stderr
    assert "1 replica (CPU)" in result.stdout and "dry run: nothing written" in result.stdout
