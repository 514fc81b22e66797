"""Which ABI a WebAssembly module speaks, read from its import and export sections (pure, no wasmtime).

covenant runs two kinds of ``runtime: wasm`` tool (docs/tools.md, "Wasm tools"):

- a WASI command: it exports ``_start`` and imports only from ``wasi_snapshot_preview1``; it reads the
  arguments document on stdin and writes its result on stdout;
- the reference runtime's ABI: it exports a function ``run`` and its ``memory``, and imports nothing.

The daemon reads this much of the binary when it resolves the toolset, so a module that fits neither is
unavailable with the reason before any call; the runner checks again when it instantiates.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["Abi", "WASI_MODULE", "module_abi"]

Abi = Literal["wasi", "run"]
WASI_MODULE = "wasi_snapshot_preview1"

_MAGIC = b"\0asm\x01\0\0\0"
_IMPORT, _EXPORT = 2, 7
_FUNC, _MEMORY = 0, 2


class _Reader:
    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data, self.pos, self.end = data, pos, len(data) if end is None else end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise ValueError("it ends in the middle of a section")
        self.pos += 1
        return self.data[self.pos - 1]

    def uleb(self) -> int:
        value = shift = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 35:
                raise ValueError("it holds a malformed integer")

    def name(self) -> str:
        size = self.uleb()
        if self.pos + size > self.end:
            raise ValueError("it ends in the middle of a name")
        raw = self.data[self.pos:self.pos + size]
        self.pos += size
        return raw.decode("utf-8", "replace")

    def skip_limits(self) -> None:
        flags = self.byte()
        self.uleb()
        if flags & 1:
            self.uleb()


def _imports(r: _Reader) -> list[str]:
    modules = []
    for _ in range(r.uleb()):
        modules.append(r.name())
        r.name()
        kind = r.byte()
        if kind == 0:  # function: a type index
            r.uleb()
        elif kind == 1:  # table: reftype + limits
            r.byte()
            r.skip_limits()
        elif kind == 2:  # memory
            r.skip_limits()
        elif kind == 3:  # global: valtype + mutability
            r.byte()
            r.byte()
        else:
            raise ValueError(f"it holds an import of unknown kind {kind}")
    return modules


def _exports(r: _Reader) -> dict[str, int]:
    out = {}
    for _ in range(r.uleb()):
        name = r.name()
        kind = r.byte()
        r.uleb()
        out[name] = kind
    return out


def module_abi(data: bytes) -> Abi:
    """``"wasi"`` or ``"run"``; ValueError saying why the module is neither (for the tool's unavailable reason)."""
    if not data.startswith(_MAGIC):
        raise ValueError("it is not a WebAssembly binary module (no \\0asm version 1 header)")
    r = _Reader(data, len(_MAGIC))
    imports: list[str] = []
    exports: dict[str, int] = {}
    while r.pos < r.end:
        section = r.byte()
        size = r.uleb()
        if r.pos + size > r.end:
            raise ValueError("a section runs past the end of the file")
        body = _Reader(data, r.pos, r.pos + size)
        if section == _IMPORT:
            imports = _imports(body)
        elif section == _EXPORT:
            exports = _exports(body)
        r.pos += size
    if exports.get("_start") == _FUNC:
        others = sorted({m for m in imports if m != WASI_MODULE})
        if others:
            raise ValueError(f"a WASI command may import only from {WASI_MODULE}; it imports from {', '.join(others)}")
        return "wasi"
    if exports.get("run") == _FUNC:
        if imports:
            raise ValueError("a module of the run(input_ptr, input_len, output_ptr, output_max) ABI imports nothing; "
                             f"it imports from {', '.join(sorted(set(imports)))}")
        if exports.get("memory") != _MEMORY:
            raise ValueError("it exports run but no memory named 'memory' to pass the input and output through")
        return "run"
    raise ValueError("it exports neither _start (a WASI command) nor a function run "
                     "(the run(input_ptr, input_len, output_ptr, output_max) ABI)")
