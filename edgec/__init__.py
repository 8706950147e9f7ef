"""edgec: profile, split, compile and benchmark dynamic models for edge devices.

``edgec.compile(model, samples, targets, settings)`` chains the stages; each stage is also a
function of its own (``edgec.profile``, ``edgec.plan``, ``edgec.quantize``, ``edgec.build``,
``edgec.bench``, ``edgec.report``). They load on first use, so that ``import edgec.runtime`` on a
device needs neither the compiler nor TVM's compiler library.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "compile": "edgec.driver", "Compiled": "edgec.driver", "CompileSettings": "edgec.driver",
    "benchmark": "edgec.driver",
    "load_model": "edgec.core.model",
    "profile": "edgec.stages.profile", "plan": "edgec.stages.plan",
    "quantize": "edgec.stages.quantize", "build": "edgec.stages.build",
    "bench": "edgec.stages.bench", "report": "edgec.stages.report",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'edgec' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(module), name)
