"""The C++ runtime (``edgec/runtime/cpp``): build the example host with g++ and check that it runs
zoo artifacts exactly like the Python runtime, and refuses bad artifacts and inputs with the same
one-line messages and exit codes.

The helpers here (building the host, building zoo artifacts, running the host) are shared with
``test_qemu_arm.py``.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import stat
import subprocess
import zipfile
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from edgec import runtime, zoo
from edgec.core import remote
from edgec.errors import ArtifactError, InputFileError, SamplesError, ToolchainError
from edgec.runtime.artifact import FORMAT_VERSION, Artifact

CPP_DIR = Path(runtime.__file__).resolve().parent / "cpp"
TOLERANCE = 1e-5


def missing_tools(*tools: str) -> list[str]:
    return [tool for tool in tools if shutil.which(tool) is None]


def build_host(cxx: str = "g++", lib_dirs: tuple[Path, Path] | None = None) -> Path:
    """``edgec_run`` built with ``cxx`` (cached; see ``edgec.core.remote.cpp_host``)."""
    try:
        return remote.cpp_host(cxx, lib_dirs)
    except ToolchainError as exc:
        pytest.fail(str(exc))


def build_artifact(proto, name: str, samples: list[dict], targets: list[str],
                   directory: Path) -> Path:
    """Profile, plan (default settings) and build ``proto`` for ``targets``; save and return it."""
    from edgec.stages.build import build
    from edgec.core.model import from_proto
    from edgec.stages.plan import PlanSettings, plan
    from edgec.stages.profile import profile
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target

    model = from_proto(proto, name)
    profiled = profile(model, [Sample(f"s{i}", a) for i, a in enumerate(samples)])
    loaded = [load_target(t) for t in targets]
    the_plan = plan(model, profiled, loaded[0], PlanSettings())
    return build(model, the_plan, loaded).save(directory / f"{name}.edgec")


def zoo_artifact(name: str, targets: list[str], directory: Path) -> tuple[Path, list[dict]]:
    """Zoo model ``name`` (seed 0, its default samples) built for ``targets``, and the samples."""
    entry = zoo.get(name)
    samples = entry.make_samples(entry.default_samples, 0)
    return build_artifact(entry.make_model(0), name, samples, targets, directory), samples


def topk_model():
    """x[n, 8] -> TopK(3): two outputs, one int64, and a kernel in libtvm_runtime_extra.so."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1, name="topk")],
        "topk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, ["n", 3])],
        [helper.make_tensor("k", TensorProto.INT64, [1], [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def topk_samples(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((n, 8)).astype(np.float32)} for n in (2, 2, 5)]


def run_host(host: Path, artifact: Path, inputs: dict[str, np.ndarray], workdir: Path,
             prefix: list[str] | None = None, extra: list[str] | None = None,
             env: dict[str, str] | None = None, compressed: bool = False) -> dict[str, np.ndarray]:
    """Run the host on ``inputs`` (written as an .npz, deflated if ``compressed``); return its
    outputs keyed by file stem."""
    workdir.mkdir(parents=True, exist_ok=True)
    (np.savez_compressed if compressed else np.savez)(workdir / "inputs.npz", **inputs)
    out = workdir / "out"
    command = [*(prefix or []), str(host), str(artifact), "--inputs", str(workdir / "inputs.npz"),
               "-o", str(out), *(extra or [])]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    return {p.stem: np.load(p) for p in sorted(out.glob("*.npy"))}


def host_error(host: Path, args: list[str]) -> tuple[int, str]:
    result = subprocess.run([str(host), *args], capture_output=True, text=True)
    return result.returncode, result.stderr.strip()


def assert_outputs_match(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], atol: float):
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=0, atol=atol, err_msg=name)


pytestmark = pytest.mark.skipif(
    bool(missing_tools("g++", "make")),
    reason=f"needs {', '.join(missing_tools('g++', 'make'))} (scripts/install-system-deps.sh cross)",
)


@pytest.fixture(scope="module")
def host() -> Path:
    return build_host()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """``artifact(name)``: zoo model ``name`` built for x86_64 once per module, and its samples."""
    root = tmp_path_factory.mktemp("cpp-artifacts")
    built: dict[str, tuple[Path, list[dict]]] = {}

    def get(name: str) -> tuple[Path, list[dict]]:
        if name not in built:
            built[name] = zoo_artifact(name, ["x86_64"], root)
        return built[name]

    return get


def _python_outputs(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return runtime.load(path).run(inputs)


def test_cnn_matches_python_runtime(host, artifact, tmp_path):
    path, samples = artifact("cnn")
    for index, sample in enumerate(samples[:3]):
        got = run_host(host, path, sample, tmp_path / str(index), compressed=index == 1)
        assert_outputs_match(got, _python_outputs(path, sample), TOLERANCE)


def test_transformer_specialized_and_fallback_shapes_match(host, artifact, tmp_path):
    path, _ = artifact("transformer")
    manifest = Artifact.load(path).manifest
    region = manifest["plan"]["regions"][0]
    specialized = [(s["batch"], s["seq"]) for s in region["specializations"]]
    fallback = [(2, 5), (3, 1)]
    assert specialized and not set(fallback) & set(specialized)
    rng = np.random.default_rng(7)
    for batch, seq in specialized + fallback:
        mask = np.ones((batch, seq), np.float32)
        mask[:, seq // 2 + 1:] = 0.0
        sample = {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64),
                  "attention_mask": mask}
        got = run_host(host, path, sample, tmp_path / f"{batch}x{seq}")
        assert_outputs_match(got, _python_outputs(path, sample), TOLERANCE)


def test_early_exit_both_branches_match(host, artifact, tmp_path):
    from edgec.core.model import from_proto
    from edgec.stages.profile import profile
    from edgec.core.samples import Sample

    path, samples = artifact("early_exit")
    for index, sample in enumerate(samples):
        got = run_host(host, path, sample, tmp_path / str(index))
        assert_outputs_match(got, _python_outputs(path, sample), TOLERANCE)
    # The samples compared above take both sides of the If.
    model = from_proto(zoo.get("early_exit").make_model(0), "early_exit")
    counts = profile(model, [Sample(f"s{i}", s) for i, s in enumerate(samples)]).control_flow
    (branches,) = [entry["branches"] for entry in counts.values()]
    assert branches.get("then", 0) > 0 and branches.get("else", 0) > 0, branches


@pytest.mark.parametrize("name", ["scan_rnn", "greedy_decoder"])
def test_loop_and_scan_models_match_python_runtime(host, artifact, tmp_path, name):
    """Scan (scan_rnn) and Loop (greedy_decoder) outputs stacked by edgec's native row kernels,
    which the host binds into the library like the Python runtime."""
    path, samples = artifact(name)
    assert {"edgec_rows_append", "edgec_rows_take"} <= set(
        Artifact.load(path).manifest["libraries"]["x86_64"]["linked_functions"])
    for index, sample in enumerate(samples[:4]):
        got = run_host(host, path, sample, tmp_path / str(index))
        assert_outputs_match(got, _python_outputs(path, sample), TOLERANCE)


def test_a_long_program_runs_as_bytecode_in_both_runtimes(host, artifact, tmp_path, monkeypatch):
    """Past MAX_COMPILED_VM_INSTRUCTIONS in one Relax function the library keeps VM bytecode
    (LLVM's time on compiled VM code grows with the square of its length); the VM must still
    find the functions linked into the library (the Scan's row kernels, oneDNN's shim)."""
    from edgec.compiler.backends import llvm

    compiled, samples = artifact("scan_rnn")
    monkeypatch.setattr(llvm, "MAX_COMPILED_VM_INSTRUCTIONS", 10)
    path = zoo_artifact("scan_rnn", ["x86_64"], tmp_path)[0]
    entry = Artifact.load(path).manifest["libraries"]["x86_64"]
    assert entry["vm_exec_mode"] == "bytecode"
    assert Artifact.load(compiled).manifest["libraries"]["x86_64"]["vm_exec_mode"] == "compiled"
    assert "edgec_rows_append" in entry["linked_functions"]
    for index, sample in enumerate(samples[:3]):
        expected = _python_outputs(compiled, sample)
        assert_outputs_match(_python_outputs(path, sample), expected, 0.0)
        assert_outputs_match(run_host(host, path, sample, tmp_path / str(index)), expected, 0.0)


def test_two_outputs_and_a_runtime_extra_kernel(host, tmp_path):
    path = build_artifact(topk_model(), "topk", topk_samples(), ["x86_64"], tmp_path)
    for index, sample in enumerate(topk_samples(1)):
        got = run_host(host, path, sample, tmp_path / str(index))
        assert_outputs_match(got, _python_outputs(path, sample), 0.0)
        np.testing.assert_array_equal(got["values"], -np.sort(-sample["x"], axis=1)[:, :3])


def test_recurrent_layer_runs_its_native_loop(host, tmp_path):
    """A bidirectional LSTM: the library's edgec_recurrent kernel, bound by the host as by the
    Python runtime."""
    from compiler.importer.test_converters_recurrent import feed, recurrent

    proto, arrays = recurrent("LSTM", directions=2, initial=True, peepholes=True)
    samples = [feed(proto, arrays, seq, 2, seed=seq) for seq in (3, 6)]
    path = build_artifact(proto, "lstm", samples, ["x86_64"], tmp_path)
    for index, sample in enumerate(samples + [feed(proto, arrays, 9, 2, seed=9)]):
        got = run_host(host, path, sample, tmp_path / str(index))
        assert_outputs_match(got, _python_outputs(path, sample), 0.0)


def test_timing_and_info(host, artifact, tmp_path):
    path, samples = artifact("cnn")
    np.savez(tmp_path / "in.npz", **samples[0])
    result = subprocess.run([str(host), str(path), "--inputs", str(tmp_path / "in.npz"),
                             "--repeat", "3"], capture_output=True, text=True, check=True)
    assert "timing over 3 calls" in result.stdout and "logits: float32 [1, 10]" in result.stdout
    info = subprocess.run([str(host), str(path), "--info"], capture_output=True, text=True,
                          check=True).stdout
    assert "library x86_64 (x86_64, cpu) lib/x86_64.so" in info
    assert "input image: float32 [1, 3, 32, 32]" in info


def _rewrite(src: Path, dst: Path, change) -> Path:
    """Copy artifact ``src`` to ``dst`` as a zip, after ``change(members, attrs)`` edits it."""
    with zipfile.ZipFile(src) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    attrs: dict[str, int] = {}
    extra: list[tuple[str, bytes]] = []
    change(members, attrs, extra)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in [*members.items(), *extra]:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = attrs.get(name, (stat.S_IFREG | 0o644) << 16)
            archive.writestr(info, data)
    dst.write_bytes(buffer.getvalue())
    return dst


def _manifest_edit(edit):
    def change(members, attrs, extra):
        manifest = json.loads(members["manifest.json"])
        edit(manifest)
        members["manifest.json"] = json.dumps(manifest).encode()
    return change


def _flip_library_byte(members, attrs, extra):
    data = bytearray(members["lib/x86_64.so"])
    data[len(data) // 2] ^= 0xFF
    members["lib/x86_64.so"] = bytes(data)


TAMPERINGS = {
    "library modified": _flip_library_byte,
    "newer format": _manifest_edit(lambda m: m.update(format_version=2)),
    "invalid format": _manifest_edit(lambda m: m.update(format_version="1")),
    "incomplete manifest": _manifest_edit(lambda m: m.pop("outputs")),
    "no libraries": _manifest_edit(lambda m: m.update(libraries={})),
    "library missing": lambda members, attrs, extra: members.pop("lib/x86_64.so"),
    "no manifest": lambda members, attrs, extra: members.pop("manifest.json"),
    "unlisted member": lambda members, attrs, extra: members.update({"notes.txt": b"hi"}),
    "escaping member": lambda members, attrs, extra: members.update({"../evil.so": b"x"}),
    "absolute member": lambda members, attrs, extra: members.update({"/tmp/evil.so": b"x"}),
    "symlink member": lambda members, attrs, extra: (
        members.update({"lib/link.so": b"lib/x86_64.so"}),
        attrs.update({"lib/link.so": (stat.S_IFLNK | 0o777) << 16})),
    "needs missing CPU features": _manifest_edit(
        lambda m: m["libraries"]["x86_64"].update(cpu_features=["no-such-feature-xyz"])),
    "duplicate member": lambda members, attrs, extra: extra.append(
        ("manifest.json", members["manifest.json"])),
}


@pytest.mark.parametrize("tampering", sorted(TAMPERINGS))
def test_bad_artifacts_refused_with_the_python_message(host, artifact, tmp_path, tampering):
    path, _ = artifact("cnn")
    with pytest.warns(UserWarning) if tampering == "duplicate member" else nullcontext():
        bad = _rewrite(path, tmp_path / "bad.edgec", TAMPERINGS[tampering])
    with pytest.raises(ArtifactError) as python_error:
        runtime.load(bad)
    code, stderr = host_error(host, [str(bad), "--info"])
    assert (code, stderr) == (ArtifactError.exit_code, f"edgec_run: error: {python_error.value}")


def test_library_that_fails_to_load_is_named(host, artifact, tmp_path):
    def replace_library(members, attrs, extra):
        members["lib/x86_64.so"] = b"not an ELF file"
        manifest = json.loads(members["manifest.json"])
        manifest["libraries"]["x86_64"]["sha256"] = hashlib.sha256(b"not an ELF file").hexdigest()
        members["manifest.json"] = json.dumps(manifest).encode()

    bad = _rewrite(artifact("cnn")[0], tmp_path / "bad.edgec", replace_library)
    with pytest.raises(ArtifactError, match="cannot load the 'x86_64' library of"):
        runtime.load(bad)
    code, stderr = host_error(host, [str(bad)])
    assert code == 7
    assert stderr.startswith(f"edgec_run: error: cannot load the 'x86_64' library of '{bad}': ")


def test_linked_function_missing_from_the_library_is_named(host, artifact, tmp_path):
    # The library's compiled VM code calls the functions the manifest lists: both runtimes bind
    # them at load, and refuse a library that lacks one, in the same words.
    bad = _rewrite(artifact("cnn")[0], tmp_path / "bad.edgec", _manifest_edit(
        lambda m: m["libraries"]["x86_64"]["linked_functions"].append("edgec_no_such_kernel")))
    with pytest.raises(ArtifactError, match="calls 'edgec_no_such_kernel', which its library does "
                                            "not contain") as python_error:
        runtime.load(bad)
    assert host_error(host, [str(bad)]) == (7, f"edgec_run: error: {python_error.value}")


def test_not_a_zip_and_corrupt_data_refused(host, artifact, tmp_path):
    bad = tmp_path / "bad.edgec"
    bad.write_bytes(b"PK\x03\x04 not really a zip" * 10)
    with pytest.raises(ArtifactError) as python_error:
        runtime.load(bad)
    assert host_error(host, [str(bad), "--info"]) == (7, f"edgec_run: error: {python_error.value}")

    # Damage the compressed bytes of the library: inflate or the CRC check must catch it.
    path, _ = artifact("cnn")
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("lib/x86_64.so")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0x55
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"is corrupt \(.*\); rebuild it"):
        runtime.load(bad)
    code, stderr = host_error(host, [str(bad), "--info"])
    assert code == 7 and stderr.startswith(f"edgec_run: error: '{bad}' is corrupt (")
    assert stderr.endswith("); rebuild it")


def test_missing_artifact_and_unknown_target(host, artifact, tmp_path):
    missing = tmp_path / "nope.edgec"
    with pytest.raises(InputFileError) as python_error:
        runtime.load(missing)
    assert host_error(host, [str(missing)]) == (3, f"edgec_run: error: {python_error.value}")
    path, _ = artifact("cnn")
    with pytest.raises(ArtifactError) as python_error:
        runtime.load(path, target="jetson")
    assert host_error(host, [str(path), "--target", "jetson"]) == (
        7, f"edgec_run: error: {python_error.value}")


@pytest.mark.parametrize("model, inputs", [
    ("cnn", {"image": np.zeros((1, 3, 32, 32), np.float64)}),
    ("cnn", {"image": np.zeros((3, 32, 32), np.float32)}),
    ("cnn", {"image": np.zeros((1, 3, 32, 31), np.float32)}),
    ("cnn", {"picture": np.zeros((1, 3, 32, 32), np.float32)}),
    ("transformer", {"input_ids": np.zeros((1, 4), np.int64),
                     "attention_mask": np.ones((1, 5), np.float32)}),
])
def test_bad_inputs_refused_with_the_python_message(host, artifact, tmp_path, model, inputs):
    path, _ = artifact(model)
    with pytest.raises(SamplesError) as python_error:
        runtime.load(path).run(inputs)
    np.savez(tmp_path / "in.npz", **inputs)
    assert host_error(host, [str(path), "--inputs", str(tmp_path / "in.npz")]) == (
        SamplesError.exit_code, f"edgec_run: error: {python_error.value}")


def test_header_agrees_with_the_python_runtime():
    # edgec.h mirrors these; a change on either side must be made on both.
    header = (CPP_DIR / "edgec.h").read_text()
    for name, error in [("kInputFile", InputFileError), ("kSamples", SamplesError),
                        ("kArtifact", ArtifactError), ("kToolchain", ToolchainError)]:
        assert f"{name} = {error.exit_code}" in header
    assert f"kFormatVersion = {FORMAT_VERSION};" in header
    assert f"kAlignment = {runtime.ALIGNMENT};" in header


def reshape_model():
    """y = Reshape(x[6], shape): ``shape`` is a graph input the plan fixes to its sampled value,
    with the general program (a data-dependent shape) as the fallback for other values."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def reduce_axes_model():
    """y = ReduceSum(x[2, 3], axes): an ``axes`` input is compiled only as a fixed value (the
    importer takes reduction axes as constants), so other values are refused."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0, name="sum")], "sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def test_a_shape_input_with_another_value_runs_the_general_program(host, tmp_path):
    x = np.arange(6, dtype=np.float32)
    samples = [{"x": x, "shape": np.array([2, 3], np.int64)}] * 2
    path = build_artifact(reshape_model(), "reshape", samples, ["x86_64"], tmp_path)
    for shape in ([2, 3], [3, 2], [6, 1]):
        inputs = {"x": x, "shape": np.array(shape, np.int64)}
        got = run_host(host, path, inputs, tmp_path / f"out{shape[0]}")
        np.testing.assert_array_equal(got["y"], x.reshape(shape))
        np.testing.assert_array_equal(runtime.load(path).run(inputs)["y"], x.reshape(shape))


def test_fixed_input_is_checked_like_the_python_runtime(host, tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    samples = [{"x": x, "axes": np.array([1], np.int64)}] * 2
    path = build_artifact(reduce_axes_model(), "sum", samples, ["x86_64"], tmp_path)
    got = run_host(host, path, samples[0], tmp_path / "ok")
    np.testing.assert_allclose(got["y"], x.sum(axis=1))
    other = {"x": x, "axes": np.array([0], np.int64)}
    with pytest.raises(SamplesError, match=r"input 'axes' is \[0\], the artifact was compiled "
                                           r"for \[1\] .*recompile with samples that cover"):
        runtime.load(path).run(other)
    np.savez(tmp_path / "other.npz", **other)
    code, stderr = host_error(host, [str(path), "--inputs", str(tmp_path / "other.npz"),
                                     "-o", str(tmp_path / "out")])
    assert code == SamplesError.exit_code
    assert "input 'axes' is [0], the artifact was compiled for [1]" in stderr
    assert "recompile with samples that cover this value" in stderr


def test_padded_buckets_match_onnxruntime(host, tmp_path):
    """A plan that pads the tagger's ``seq`` to buckets: the padding and slicing are compiled into
    ``main``, so the C++ host runs them too; unseen lengths match onnxruntime."""
    from edgec.stages.build import build
    from edgec.core.model import from_proto
    from edgec.stages.plan import PlanSettings, plan
    from edgec.stages.profile import profile
    from edgec.core.reference import reference_session
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target
    from edgec.zoo import bucketed

    model = from_proto(bucketed.make_token_tagger(0), "token_tagger")
    samples = [Sample(f"s{i}", a) for i, a in enumerate(bucketed.token_tagger_samples(16, 0))]
    target = load_target("x86_64")

    def measured(index, option, dims, bucket=None):  # static copies 10x faster: buckets pay
        return (bucket or dims)["seq"] * (0.1 if option in ("specialized", "padded") else 1.0)

    the_plan = plan(model, profile(model, samples), target, PlanSettings("oracle", 2),
                    measured=measured, samples=samples)
    assert the_plan.regions[0].padding["used"]
    path = build(model, the_plan, [target]).save(tmp_path / "tagger.edgec")
    largest = the_plan.regions[0].specializations[0]["dims"]["seq"]
    reference = reference_session(model.proto)
    for length in (3, largest - 1, largest + 2):
        ids = (np.arange(length, dtype=np.int64) * 5 % bucketed.TAGGER_VOCAB)[None, :]
        got = run_host(host, path, {"input_ids": ids}, tmp_path / str(length))
        assert_outputs_match(got, reference.run({"input_ids": ids}), 1e-4)


def test_sequence_artifact_is_refused_in_one_line(host, tmp_path):
    """The sequence/optional boundary is mapped by the Python runtime only: the host says so."""
    import edgec
    from core.test_sequences import _lists, _seq_model
    from edgec.core.model import from_proto
    from edgec.core.samples import Sample

    model = from_proto(_seq_model(), "seq")
    path = edgec.compile(model, [Sample("s", {"xs": _lists(0, 2)})]).artifact.save(
        tmp_path / "seq.edgec")
    code, stderr = host_error(host, [str(path), "--info"])
    assert code != 0 and "sequences or optionals" in stderr and "\n" not in stderr


@pytest.fixture(scope="module")
def signing(artifact, tmp_path_factory):
    """The cnn artifact signed by a builder's key, and the builder's and a stranger's keys."""
    pytest.importorskip("cryptography")
    from edgec.signing import generate_keypair, load_private_key, sign_artifact

    folder = tmp_path_factory.mktemp("signing")
    builder, stranger = generate_keypair(folder / "builder"), generate_keypair(folder / "stranger")
    path, _ = artifact("cnn")
    signed = sign_artifact(Artifact.load(path), load_private_key(builder[0]))
    return {"unsigned": path, "signed": signed.save(folder / "signed.edgec"),
            "builder": builder, "stranger": stranger}


def _signed_variant(kind: str, signing: dict, directory: Path) -> Path:
    """The signed cnn artifact after ``kind`` of tampering (test_signing.py's, and more)."""
    import dataclasses

    from edgec.signing import load_private_key, sign_artifact

    original = Artifact.load(signing["signed"])
    changed = original
    if kind == "unsigned":
        return signing["unsigned"]
    if kind == "manifest modified":  # the declared inputs changed, the signature kept
        manifest = json.loads(json.dumps(original.manifest))
        manifest["inputs"][0]["dims"][2] = 64
        changed = dataclasses.replace(original, manifest=manifest)
    elif kind == "library replaced, checksum updated":  # loading it would fail: refused before
        manifest = json.loads(json.dumps(original.manifest))
        manifest["libraries"]["x86_64"]["sha256"] = hashlib.sha256(b"not an ELF file").hexdigest()
        changed = dataclasses.replace(original, manifest=manifest,
                                      files={"lib/x86_64.so": b"not an ELF file"})
    elif kind == "library modified":  # manifest and signature kept: the checksum catches it
        library = bytearray(original.files["lib/x86_64.so"])
        library[100] ^= 1
        changed = dataclasses.replace(original, files={"lib/x86_64.so": bytes(library)})
    elif kind == "re-signed by another key":
        changed = sign_artifact(original, load_private_key(signing["stranger"][0]))
    else:
        document = json.loads(original.signature)
        signature = {
            "garbled signature": b"{not json",
            "signature not hex": json.dumps({**document, "signature": "zz"}).encode(),
            "signature missing": json.dumps({"algorithm": "ed25519"}).encode(),
            "signature a list": b"[1, 2]",
            "another algorithm": json.dumps({**document, "algorithm": "rsa"}).encode(),
            "signature cut short": json.dumps(
                {**document, "signature": document["signature"][:64]}).encode(),
        }[kind]
        changed = dataclasses.replace(original, signature=signature)
    return changed.save(directory / "tampered.edgec")


SIGNATURE_TAMPERINGS = ["unsigned", "manifest modified", "library replaced, checksum updated",
                        "library modified", "re-signed by another key", "garbled signature",
                        "signature not hex", "signature missing", "signature a list",
                        "another algorithm", "signature cut short"]


@pytest.mark.parametrize("tampering", SIGNATURE_TAMPERINGS)
def test_signature_refusals_match_the_python_runtime(host, signing, tmp_path, tampering):
    """--require-signature refuses what `edgec run --require-signature` refuses, in its words,
    before loading the library (with --info, and when loading to run)."""
    bad = _signed_variant(tampering, signing, tmp_path)
    public = signing["builder"][1]
    with pytest.raises(ArtifactError) as python_error:
        runtime.open_artifact(bad, require_signature=public)
    expected = (ArtifactError.exit_code, f"edgec_run: error: {python_error.value}")
    for extra in (["--info"], []):
        assert host_error(host, [str(bad), "--require-signature", str(public), *extra]) == expected


def test_signed_artifact_runs_with_the_trusted_key_in_each_form(host, signing, artifact, tmp_path):
    """The builder's .pub (PEM), the same key as 32 raw bytes, and `openssl pkey -pubout`'s PEM
    all verify; without --require-signature a signed artifact loads as before."""
    from edgec.signing import load_public_key

    public = signing["builder"][1]
    raw = tmp_path / "builder.raw"
    raw.write_bytes(load_public_key(public).public_bytes_raw())
    keys = [public, raw]
    if shutil.which("openssl"):
        subprocess.run(["openssl", "pkey", "-in", str(signing["builder"][0]), "-pubout", "-out",
                        str(tmp_path / "openssl.pub")], check=True)
        keys.append(tmp_path / "openssl.pub")
    for key in keys:
        result = subprocess.run([str(host), str(signing["signed"]), "--info",
                                 "--require-signature", str(key)], capture_output=True, text=True)
        assert result.returncode == 0 and "runs x86_64" in result.stdout, (key, result.stderr)
    _, samples = artifact("cnn")
    expected = _python_outputs(signing["signed"], samples[0])
    got = run_host(host, signing["signed"], samples[0], tmp_path / "run",
                   extra=["--require-signature", str(public)])
    assert_outputs_match(got, expected, TOLERANCE)
    assert_outputs_match(run_host(host, signing["signed"], samples[0], tmp_path / "plain"),
                         expected, TOLERANCE)


def test_unusable_keys_are_named_like_the_python_runtime(host, signing, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ec_key = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "ec.pub").write_bytes(ec_key)
    (tmp_path / "junk.pub").write_bytes(b"-----BEGIN PUBLIC KEY-----\nnope\n")
    (tmp_path / "short.pub").write_bytes(b"31 bytes, neither raw nor PEM..")
    for name in ("missing.pub", "ec.pub", "junk.pub", "short.pub"):
        key = tmp_path / name
        with pytest.raises(InputFileError) as python_error:
            runtime.open_artifact(signing["signed"], require_signature=key)
        assert host_error(host, [str(signing["signed"]), "--info", "--require-signature",
                                 str(key)]) == (InputFileError.exit_code,
                                                f"edgec_run: error: {python_error.value}")
