"""Everything that touches TVM's compiler API lives in this package, so an upgrade is a small diff.

``frontend`` imports ONNX into Relax, ``dispatch`` adds shape specializations and the dispatch in
``main``, ``codegen`` compiles a module for a kind of target and exports its library.
"""
