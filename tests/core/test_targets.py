import pytest

from edgec.errors import TargetError
from edgec.core.targets import list_targets, load_target


def test_host_target_is_listed_and_loads():
    names = [t.name for t in list_targets()]
    assert "x86_64" in names
    target = load_target("x86_64")
    assert target.kind == "llvm" and target.arch == "x86_64"
    assert target.tvm["kind"] == "llvm"


def test_unknown_target_lists_known_ones():
    with pytest.raises(TargetError, match="unknown target 'x86-64'; known: .*x86_64"):
        load_target("x86-64")


def test_typo_in_target_file_is_named(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\nkind = "llvm"\narch = "x86_64"\n[tvm]\nkind = "llvm"\n[rnu]\nmode="local"\n')
    with pytest.raises(TargetError, match="unknown key.*rnu"):
        load_target(path)
    path.write_text('name = "mine"\nkind = "vulkan"\narch = "x86_64"\n[tvm]\nkind = "llvm"\n')
    with pytest.raises(TargetError, match="kind 'vulkan' unknown; known: llvm"):
        load_target(path)
    path.write_text('name = "mine"\nkind = "llvm"\n[tvm\n')
    with pytest.raises(TargetError, match="not valid TOML"):
        load_target(path)
