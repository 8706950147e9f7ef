"""The reference executor: outputs to compare against and the latency to beat.

ONNX Runtime for ONNX models; torch itself, eagerly, for PyTorch programs (see ``reference_for``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from edgec.errors import ModelError, describe


@dataclass
class ReferenceSession:
    """An onnxruntime CPU session over a model, returning outputs by name."""

    session: ort.InferenceSession
    output_names: list[str]
    name = "onnxruntime"

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self.session.run(self.output_names, arrays)
        return dict(zip(self.output_names, values))

    def timed_run(self, arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Run once and return the outputs and the wall time in milliseconds."""
        start = time.perf_counter()
        outputs = self.run(arrays)
        return outputs, (time.perf_counter() - start) * 1e3


def reference_session(
    proto: onnx.ModelProto,
    threads: int = 2,
    optimize: bool = True,
    profile_prefix: str | None = None,
    spinning: bool = False,
) -> ReferenceSession:
    """Open an onnxruntime session on ``proto``.

    ``threads`` sets the intra-op pool, whose threads do not spin between runs unless
    ``spinning`` (onnxruntime's own default, and its speed: 1.3x faster on efficientnet_b0 at 2
    threads than without, measured), which a timing of onnxruntime as a peer uses; its threads
    go idle within milliseconds of the last run. ``optimize=False`` keeps the graph's nodes as they
    are, which per-node profiling needs. ``profile_prefix`` turns on onnxruntime's profiler.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    try:
        session = ort.InferenceSession(
            proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own exception types per failure
        raise ModelError(f"onnxruntime cannot load the model: {describe(exc)}") from None
    return ReferenceSession(session, [o.name for o in session.get_outputs()])


def reference_for(model: Any, threads: int = 2) -> Any:
    """The reference executor of ``model``: an onnxruntime session for an ONNX model, the program
    run eagerly by torch for a PyTorch program. Both have ``name``, ``run`` and ``timed_run``."""
    if model.kind == "torch":
        from edgec.core.torch_program import TorchReference  # torch is an optional extra

        return TorchReference(model)
    return reference_session(model.proto, threads=threads)
