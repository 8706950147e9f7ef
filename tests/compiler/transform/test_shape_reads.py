"""UnfusedShapeReads: reads of symbolic dims into tensors stay out of fusion, nothing else does."""

import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from edgec.compiler.transform.shape_reads import UnfusedShapeReads


@I.ir_module
class _Reads:
    @R.function
    def main(x: R.Tensor(("n",), "float32")):
        n = T.int64()
        with R.dataflow():
            dims = R.shape_to_tensor(R.shape([n]))
            fixed = R.shape_to_tensor(R.shape([4]))
            total = R.add(R.add(dims, dims), fixed)
            R.output(total)
        return total


def _patterns(mod):
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    return {gv.name_hint: int(f.attrs["op_pattern"]) for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)}


def test_only_reads_of_symbolic_dims_become_opaque():
    legalized = relax.transform.LegalizeOps()(_Reads)
    before, after = _patterns(legalized), _patterns(UnfusedShapeReads(legalized))
    symbolic = [name for name in after if name.startswith("shape_to_tensor") and after[name] == 8]
    assert len(symbolic) == 1 and before[symbolic[0]] != 8
    assert {k: v for k, v in after.items() if k not in symbolic} == \
        {k: v for k, v in before.items() if k not in symbolic}


def test_the_symbolic_read_is_not_fused_with_its_consumers():
    mod = relax.transform.LegalizeOps()(_Reads)
    fused = relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(UnfusedShapeReads(mod)))
    main = fused["main"].script(show_meta=False)
    assert "dims = R.call_tir(shape_to_tensor, (n,)" in main  # its own kernel, fed to the fused adds
    assert "fused_shape_to_tensor1_add_add(dims)" in main
