"""edgec's ONNX operator converters, for the ops TVM's importer lacks or mishandles: control flow
(``control_flow``, ``subgraph``), shapes (``shapes``) and single ops (``ops``); the table that
puts them over TVM's is ``edgec.compiler.importer.converter_table``."""
