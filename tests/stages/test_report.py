import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import pytest

from conftest import MLP_SHAPES, mlp_model, mlp_samples
from edgec.stages.bench import BenchResult, BenchSettings, bench
from edgec.cli import main
from edgec.core.model import from_proto
from edgec.stages.report import (SERVED_COLOURS, SYSTEM_COLOURS, BaselineMismatchError,
                                 RegressionError, _dim_chart, _shape_chart, compare, parse_margin,
                                 report, served_by, shape_frame, summary_row)
from edgec.core.samples import Sample


@pytest.fixture(scope="module")
def result(mlp_artifact):
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]
    return bench(mlp_artifact, from_proto(mlp_model(), "mlp"), samples, BenchSettings(runs=2, warmup=1))


def _with(result, **changes):
    data = json.loads(json.dumps(result.data))
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    return BenchResult(data)


def test_report_writes_every_format(result, tmp_path):
    files = report([result]).files
    assert set(files) == {"report.md", "report.html", "report.csv", "report.json", "benchmark-action.json"}
    assert "<svg" in files["report.html"] and "specialized" in files["report.html"]
    action = json.loads(files["benchmark-action.json"])
    assert {"name", "unit", "value"} <= set(action[0]) and action[0]["value"] == result["edgec"]["p50_ms"]
    assert json.loads(files["report.json"])["results"][0]["model"] == "mlp"


def test_report_is_the_same_bytes_every_time(result, tmp_path):
    """matplotlib's SVG ids are salted and dated by default: fixed here, so the same results give
    the same report in this process and in another one."""
    first = report([result]).files
    assert report([result]).files == first
    result.save(tmp_path / "r.json")
    script = ("import sys; from edgec.stages.bench import BenchResult; from edgec.stages.report "
              "import report; sys.stdout.write(report([BenchResult.load(sys.argv[1])]).files"
              "['report.html'])")
    other = subprocess.run([sys.executable, "-c", script, str(tmp_path / "r.json")],
                           capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"}).stdout
    assert other == first["report.html"]
    assert "<svg" in other and "<?xml" not in other and "dc:date" not in other


def test_tables_for_people_have_words_and_only_backed_percentiles(result):
    """Markdown and HTML headers are spelled out (CSV and JSON keep the keys); p90 and p99 show
    only with 10 and 100 calls behind them, and the page says why."""
    files = report([result]).files  # runs=2 on 10 samples: 20 calls in all, 2 to 10 per shape
    lines = files["report.md"].splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| model |"))
    assert lines[header].startswith("| model | target | edgec p50 ms | edgec p90 ms | edgec p99 ms |")
    row = lines[header + 2].split(" | ")
    assert row[3] != "—" and row[4] == "—", "p90 of 20 calls shown, p99 not"
    assert "p99 from 100" in files["report.md"] and "edgec_p50_ms" not in files["report.md"]
    assert "<th>edgec p50 ms</th>" in files["report.html"] and "edgec_p50_ms" not in files["report.html"]
    assert files["report.csv"].startswith("model,target,edgec_p50_ms,edgec_p90_ms")
    many = _with(result, edgec__runs=400)
    assert "| — |" not in report([many]).files["report.md"].splitlines()[header + 2]


def test_each_shape_says_which_function_ran_it(result):
    """From the plan the artifact was built with: a shape it specialized ran its function, any
    other shape the symbolic fallback; a static region's shapes ran static code."""
    plan = json.loads(json.dumps(result["plan"]))
    plan["regions"][0]["specializations"] = [{"batch": 1, "seq": 8}]  # the others fall back
    mixed = _with(result, plan=plan)
    for row in result["per_shape"]:
        expected = "specialized" if row["shape"] == "batch=1,seq=8" else "symbolic"
        assert served_by(mixed, row["shape"]) == expected
    markdown = report([mixed]).files["report.md"]
    assert "| batch=1,seq=8 | 5 | specialized |" in markdown
    assert "| batch=2,seq=4 | 3 | symbolic fallback |" in markdown
    html_text = report([mixed]).files["report.html"]
    assert "batch=1,seq=8  (specialized)" in html_text
    assert "batch=2,seq=4  (symbolic fallback)" in html_text
    static = _with(result, plan={"regions": [{"name": "main", "mode": "static",
                                              "specializations": []}]})
    assert served_by(static, "static") == "static"
    assert _shape_chart(_with(result, per_shape=result["per_shape"][:1])) == "", \
        "one shape: the chart of every call says it all"


def test_latency_against_a_dim_keeps_batch_sizes_apart(result):
    """The line chart's x is the dim with the most values (seq); each batch size gets its own
    panel, so no line joins a batch=1 point to a batch=4 one."""
    frame = shape_frame(result)
    batches = sorted(frame["dim:batch"].unique())
    assert len(batches) > 1 and frame["dim:seq"].nunique() >= frame["dim:batch"].nunique()
    svg = _dim_chart(result)
    for batch in batches:
        assert f">batch={batch}<" in svg
    assert "Median latency against seq, one panel per batch" in svg


def test_markdown_says_what_each_route_costs_on_the_device(result):
    """The runtime bytes per route: TVM's runtime (its files summed) and each native library."""
    routed = _with(result, runtime_files={"libtvm_runtime.so": 3_000_000, "libtvm_ffi.so": 2_500_000,
                                          "libdnnl.so.2": 39_600_000})
    markdown = report([routed]).files["report.md"]
    assert ("- runtime on the device: 45.1 MB: TVM runtime 5.5 MB (libtvm_ffi.so, libtvm_runtime.so); "
            "libdnnl.so.2 39.6 MB") in markdown


def test_compare_flags_a_real_regression_and_passes_without_one(result):
    baseline = [summary_row(result)]
    _, none = compare([result], baseline, 0.10)
    assert none == []
    slower = _with(result, ratio_p50=result["ratio_p50"] * 1.5)
    table, regressions = compare([slower], baseline, 0.10)
    assert len(regressions) == 1 and "ratio_p50" in regressions[0] and "REGRESSED" in table
    _, within = compare([_with(result, ratio_p50=result["ratio_p50"] * 1.05)], baseline, 0.10)
    assert within == []
    worse = _with(result, accuracy__max_rel=0.01, accuracy__cosine_min=0.9)
    assert len(compare([worse], baseline, 0.10)[1]) == 2
    assert parse_margin("10%") == pytest.approx(0.1) and parse_margin("0.25") == 0.25


def test_cli_compare_exit_codes(result, tmp_path):
    result.save(tmp_path / "now.json")
    assert main(["report", str(tmp_path / "now.json"), "-o", str(tmp_path / "base")]) == 0
    assert main(["report", str(tmp_path / "now.json"), "-o", str(tmp_path / "same"),
                 "--compare", str(tmp_path / "base" / "report.json")]) == 0
    _with(result, ratio_p50=result["ratio_p50"] * 2).save(tmp_path / "slow.json")
    code = main(["report", str(tmp_path / "slow.json"), "-o", str(tmp_path / "slow"),
                 "--compare", str(tmp_path / "base" / "report.json"), "--max-regression", "10%"])
    assert code == RegressionError.exit_code
    assert "REGRESSED" in (tmp_path / "slow" / "compare.md").read_text()


def test_compare_refuses_a_baseline_that_shares_no_model(result, tmp_path, capsys):
    """A gate that matched nothing must fail, not pass: one line naming both sides' models."""
    renamed = [{**summary_row(result), "model": "ee"}]
    with pytest.raises(BaselineMismatchError, match="results mlp/x86_64, baseline ee/x86_64"):
        compare([result], renamed, 0.10)
    table, _ = compare([result, _with(result, model="other")], [summary_row(result)], 0.10)
    assert "| other | x86_64 | all | — | — | — | new |" in table, "one match is enough to compare"

    result.save(tmp_path / "now.json")
    _with(result, model="ee").save(tmp_path / "ee.json")
    assert main(["report", str(tmp_path / "ee.json"), "-o", str(tmp_path / "base")]) == 0
    capsys.readouterr()
    code = main(["report", str(tmp_path / "now.json"), "-o", str(tmp_path / "now"),
                 "--compare", str(tmp_path / "base" / "report.json")])
    err = capsys.readouterr().err.strip()
    assert code == BaselineMismatchError.exit_code != 0
    assert len(err.splitlines()) == 1 and "mlp/x86_64" in err and "ee/x86_64" in err


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA PNG into rows of raw pixel bytes (enough for screenshots)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytes(width * channels)
    for y in range(height):
        filt, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            pred = {0: 0, 1: a, 2: b, 3: (a + b) // 2}.get(filt)
            if pred is None:
                p = a + b - c
                pred = a if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c) else (
                    b if abs(p - b) <= abs(p - c) else c)
            line[i] = (line[i] + pred) & 0xFF
        prev = bytes(line)
        rows.append([prev[i:i + 3] for i in range(0, stride, channels)])
    return width, height, rows


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)")
def test_html_report_renders_plots_in_headless_chromium(result, tmp_path):
    """Every chart is drawn: each system's bars in its colour, the split's and the shape labels'
    colours for specialized and symbolic, none of them the same colour."""
    report([result]).save(tmp_path)
    shot = tmp_path / "shot.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,2400",
         f"--screenshot={shot}", (tmp_path / "report.html").as_uri()],
        capture_output=True, timeout=120, check=True)
    width, height, rows = _png_pixels(shot.read_bytes())
    pixels = [p for row in rows[::4] for p in row[::4]]
    non_white = sum(1 for p in pixels if p != b"\xff\xff\xff")
    assert non_white > 0.02 * len(pixels), "the page rendered (almost) blank"
    drawn = [SYSTEM_COLOURS[s] for s in ("edgec", "onnxruntime", "onnxruntime-1t")]
    drawn += [SERVED_COLOURS[k] for k in ("specialized", "symbolic")]
    assert len(set(drawn)) == len(drawn), "a colour means two things"
    missing = {c for c in drawn if bytes.fromhex(c[1:]) not in set(pixels)}
    assert not missing, f"colours {missing} are not on the page: a chart or the split is missing"
