"""Remote devices through TVM's RPC (``edgec.core.remote``): a tracker and a server on 127.0.0.1 (TVM's
own ``tvm.exec.rpc_tracker`` and ``tvm.exec.rpc_server``, subprocesses on free ports), a target
file whose ``[run]`` section points at them, and ``edgec bench`` / ``edgec run`` through them.

The server side here uses the full ``tvm`` package; on a device it is TVM's RPC server for that
device. The tracker needs ``tornado`` (the dev extra).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgec import runtime, zoo
from edgec.core import remote
from edgec.errors import TargetError, ToolchainError
from edgec.core.targets import load_target

KEY = "edgec-test"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tornado") is None,
                                reason="TVM's RPC tracker needs tornado (pip install edgec[dev])")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    pytest.fail(f"{what} did not come up within {timeout:.0f} s")


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def rpc_target_file(directory: Path, port: int, key: str = KEY, name: str = "x86_64-rpc") -> Path:
    """The x86_64 target (without oneDNN) run through the tracker at 127.0.0.1:``port``."""
    path = directory / f"{name}.toml"
    path.write_text(f'''name = "{name}"
description = "this machine's CPU behind a TVM RPC tracker (test)"
kind = "llvm"
arch = "x86_64"
cpu_features = ["avx2", "fma"]

[tvm]
kind = "llvm"
mtriple = "x86_64-pc-linux-gnu"
mattr = ["+avx2", "+fma"]

[run]
mode = "rpc"
host = "127.0.0.1"
port = {port}
key = "{key}"
''')
    return path


@pytest.fixture(scope="module")
def tracker_port():
    """A tracker and one server registered under KEY, both stopped afterwards."""
    port = free_port()
    # Own process groups: the tracker and server each run a popen_worker child that outlives a
    # plain terminate(); the whole group is ended afterwards.
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                "--port", str(port), "--port-end", str(port + 1)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    server = None
    try:
        wait_until(lambda: accepts(port), "the RPC tracker")
        server_port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
             "--port", str(server_port), "--port-end", str(server_port + 1),
             "--tracker", f"127.0.0.1:{port}", "--key", KEY],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

        def registered() -> bool:
            from tvm import rpc

            return bool(rpc.connect_tracker("127.0.0.1", port).summary()["server_info"])

        wait_until(registered, "the RPC server")
        yield port
    finally:
        for process in (server, tracker):
            if process is not None:
                os.killpg(process.pid, signal.SIGTERM)  # the group started for it, nothing else
                process.wait(timeout=30)


@pytest.mark.slow
def test_bench_and_run_through_rpc_match_local(tracker_port, tmp_path):
    zoo.export("cnn", tmp_path / "cnn")
    model, samples = tmp_path / "cnn" / "model.onnx", tmp_path / "cnn" / "samples"
    target = rpc_target_file(tmp_path, tracker_port)
    artifact = tmp_path / "cnn.edgec"
    edgec = [sys.executable, "-m", "edgec"]
    subprocess.run([*edgec, "compile", str(model), "--samples", str(samples), "--target", "x86_64",
                    "--target", str(target), "-o", str(artifact)], check=True, capture_output=True, timeout=600)
    result = subprocess.run([*edgec, "bench", str(artifact), "--samples", str(samples),
                             "--target", str(target), "--runs", "3", "--warmup", "1",
                             "-o", str(tmp_path / "bench.json")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["target"] == "x86_64-rpc"
    assert bench["run"]["mode"] == "rpc" and "round trip" in bench["run"]["timing"]
    assert bench["accuracy"]["max_rel"] < 1e-4
    print(f"\ncnn through RPC on 127.0.0.1: p50 {bench['edgec']['p50_ms']:.3f} ms "
          f"(onnxruntime here {bench['onnxruntime']['p50_ms']:.3f} ms)")

    # TVM's server serves one session at a time: the CLI's ends before this process opens one.
    first, out = sorted(samples.glob("*.npz"))[0], tmp_path / "out.npz"
    result = subprocess.run([*edgec, "run", str(artifact), "--inputs", str(first),
                             "--target", str(target), "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    local_model = runtime.load(artifact, target="x86_64")
    expected = local_model.run(dict(np.load(first)))
    with np.load(out) as written:
        assert sorted(written.files) == sorted(expected)
        for name, value in expected.items():
            assert np.allclose(written[name], value, atol=1e-4), name

    remote_model = remote.load(artifact, target=str(target))
    assert (remote_model.target, remote_model.device) == ("x86_64-rpc", "cpu")
    for path in sorted(samples.glob("*.npz"))[:3]:
        sample = dict(np.load(path))
        got, expected = remote_model.run(sample), local_model.run(sample)
        assert list(got) == list(expected)
        for name, value in expected.items():
            assert got[name].shape == value.shape
            assert float(np.abs(got[name] - value).max()) <= 1e-4 * max(1.0, float(np.abs(value).max()))
    del remote_model  # ends the session, freeing the server for the next test


def test_unknown_key_names_the_registered_ones(tracker_port, tmp_path):
    target = load_target(rpc_target_file(tmp_path, tracker_port, key="no-such-device", name="nokey"))
    with pytest.raises(ToolchainError, match=f"no device with key 'no-such-device'.*{KEY}"):
        remote.connect(target)


def test_rpc_target_needs_host_port_and_key(tmp_path):
    path = rpc_target_file(tmp_path, 1)
    path.write_text(path.read_text().replace('key = "edgec-test"\n', ""))
    with pytest.raises(TargetError, match="host .string., port .integer. and key"):
        remote.rpc_address(load_target(path))


def test_a_tracker_that_is_down_fails_at_once_in_one_line(tmp_path, caplog):
    """No tracker listens on the port: one error naming the address and how to start it, without
    TVM's retry warnings (12 of them over 60 s before)."""
    port = free_port()
    target = load_target(rpc_target_file(tmp_path, port, name="down"))
    with pytest.raises(ToolchainError) as raised:
        remote.connect(target)
    message = str(raised.value)
    assert f"cannot reach the RPC tracker 127.0.0.1:{port} of target 'down'" in message
    assert f"python -m tvm.exec.rpc_tracker --host 127.0.0.1 --port {port}" in message
    assert "\n" not in message
    assert not [r for r in caplog.records if "retry" in r.getMessage()]
