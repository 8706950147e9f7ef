"""Bind the functions edgec links into a model library (its oneDNN shim, NonZero...) for the
library's compiled VM code.

A library built with ``vm_exec_mode = "compiled"`` runs its Relax functions as native code, which
finds every function it calls by name among the library module's imports, then in TVM's global
registry, and caches what it found in the library module; it never looks among the library's own
exported symbols, where edgec's shims are. So, once per load, each name the manifest lists in
``linked_functions`` is registered just long enough for the library to look it up and cache it,
then the registry is restored: no other library ever sees it.

The function bound wraps the symbol's address and holds no reference to the library (one would
be a cycle through the library's own cache, and the library would never unload); the cache that
holds it dies with the library, so it can never outlive the code it points to.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from edgec.errors import ArtifactError

_RTLD_NOW = 2
_RTLD_NOLOAD = 4  # glibc: only return a handle if the library is already loaded
_SYMBOL_PREFIX = "__tvm_ffi_"  # TVM_FFI_DLL_EXPORT_TYPED_FUNC's exported name for a function
_CONTEXT_SYMBOL = b"__tvm_ffi__library_ctx"
_LOCK = threading.Lock()  # the registry is process-wide: one binding at a time


def bind_linked_functions(tvm_ffi: Any, library_path: str, names: list[str], where: str) -> None:
    """Make ``names`` (functions linked into ``library_path``, which ``tvm_ffi.load_module`` has
    loaded) callable by the library's compiled VM code. Must run while the file still exists."""
    if not names:
        return
    libc = ctypes.CDLL(None)
    libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    libc.dlsym.restype, libc.dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    libc.dlclose.argtypes = [ctypes.c_void_p]
    lookup = _ffi_library().TVMFFIEnvModLookupFromImports
    lookup.restype = ctypes.c_int
    lookup.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    # Another reference to the copy the loader opened (not a second copy), released below: the
    # module's own reference keeps it loaded.
    handle = libc.dlopen(library_path.encode(), _RTLD_NOW | _RTLD_NOLOAD)
    if not handle:
        raise ArtifactError(f"{where}: its library is not loaded; cannot bind {', '.join(names)}")
    try:
        # The library module as its compiled code sees it: the loader stores it in this symbol.
        context = libc.dlsym(handle, _CONTEXT_SYMBOL)
        library = ctypes.c_void_p.from_address(context).value if context else None
        if not library:
            raise ArtifactError(f"{where}: its library has no module context to bind "
                                f"{', '.join(names)} into; rebuild the artifact")
        for name in names:
            address = libc.dlsym(handle, (_SYMBOL_PREFIX + name).encode())
            if not address:
                raise ArtifactError(f"{where} calls '{name}', which its library does not "
                                    f"contain; rebuild the artifact with this edgec")
            function = tvm_ffi._ffi_api.FunctionFromExternC(None, ctypes.c_void_p(address), None)
            _cache_in_library(tvm_ffi, lookup, library, name, function, where)
    finally:
        libc.dlclose(handle)


def _cache_in_library(tvm_ffi: Any, lookup: Any, library: int, name: str, function: Any,
                      where: str) -> None:
    with _LOCK:
        previous = tvm_ffi.get_global_func(name, allow_missing=True)
        tvm_ffi.register_global_func(name, function, override=True)
        try:
            out = ctypes.c_void_p()
            status = lookup(library, name.encode(), ctypes.byref(out))
        finally:
            if previous is not None:
                tvm_ffi.register_global_func(name, previous, override=True)
            else:
                tvm_ffi.remove_global_func(name)
    if status != 0:
        raise ArtifactError(f"{where}: binding '{name}' into its library failed; rebuild the "
                            f"artifact with this edgec")


_FFI_LIBRARY: ctypes.CDLL | None = None


def _ffi_library() -> ctypes.CDLL:
    """libtvm_ffi.so, already loaded by ``tvm_ffi`` (this opens the same copy)."""
    global _FFI_LIBRARY
    if _FFI_LIBRARY is None:
        from tvm_ffi import libinfo

        _FFI_LIBRARY = ctypes.CDLL(libinfo.find_libtvm_ffi())
    return _FFI_LIBRARY
