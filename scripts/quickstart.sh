#!/usr/bin/env bash
# The main job end to end on a bundled zoo model: install, export, compile, run, bench, report.
# Usage: scripts/quickstart.sh [ZOO_MODEL] (default: transformer). Everything lands in out/.
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:-transformer}"
bash scripts/install-system-deps.sh build   # g++ and oneDNN (needs root on a fresh machine)
bash scripts/setup-venv.sh
edgec=.venv/bin/edgec
out="out/$name"
$edgec zoo export "$name" -o "$out"
$edgec compile "$out/model.onnx" --samples "$out/samples" --target x86_64 \
    --save-stages "$out" -o "$out/$name.edgec"
$edgec inspect "$out/$name.edgec"
$edgec run "$out/$name.edgec" --inputs "$out/samples/sample_000.npz" -o "$out/outputs_000.npz"
$edgec bench "$out/$name.edgec" --samples "$out/samples" -o "$out/bench.json"
$edgec report "$out/bench.json" -o "$out/report"
cat "$out/report/report.md"
# The commands above name .venv/bin/edgec; the README's bare `edgec` needs the venv on PATH.
echo
echo "edgec is installed in .venv; to run it as \`edgec\` in this shell: . .venv/bin/activate"
