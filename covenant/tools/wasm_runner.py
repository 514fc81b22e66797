"""Runs one ``runtime: wasm`` tool call through wasmtime: the program of a wasm tool's process.

Started by the tool runner like a process tool (the agent's uid, its limits, its Landlock rules) as
``python -I wasm_runner.py MODULE ABI FUEL MEMORY_BYTES OUTPUT_MAX``, never inside the daemon. It
imports only the standard library and ``wasmtime``: it runs in the agent's sandbox, where covenant's
package is not on the path.

- ``wasi``: the module's ``_start`` with this process's stdin, stdout and stderr, no arguments, no
  environment, no directories; its exit code is this process's.
- ``run``: the arguments document (stdin) is copied into fresh pages grown at the end of the module's
  memory, followed by an output buffer of OUTPUT_MAX bytes; ``run(input_ptr, input_len, output_ptr,
  output_max)`` returns how many bytes of output it wrote (a negative number is its own failure),
  which are written to stdout.

Fuel (about one WebAssembly instruction each) and the memory cap are set on the store: a module that
spends its fuel or outgrows its memory stops with a trap, reported on stderr with exit code 1.
"""

from __future__ import annotations

import sys

_PAGE = 65536


def _fail(message: str) -> None:
    sys.stderr.write(f"wasm tool: {message}\n")
    sys.stderr.flush()
    sys.exit(1)


def _trap_message(exc: Exception, fuel: int, memory_bytes: int) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if any("fuel" in line for line in lines):
        return f"it ran out of fuel ({fuel} units: the tool's timeout_ms × [tools.wasm] fuel_per_ms) and was stopped"
    reason = lines[-1] if lines else type(exc).__name__
    return f"it trapped ({reason}); its memory is capped at {memory_bytes // (1024 * 1024)} MiB (its resource_profile)"


def main(argv: list[str]) -> None:
    try:
        import wasmtime
    except ImportError as exc:
        _fail(f"this interpreter cannot import wasmtime ({exc})")
    module_path, abi, fuel, memory_bytes, output_max = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    config = wasmtime.Config()
    config.consume_fuel = True
    config.parallel_compilation = False
    engine = wasmtime.Engine(config)
    store = wasmtime.Store(engine)
    store.set_limits(memory_size=memory_bytes, instances=1, memories=1, tables=4, table_elements=100_000)
    store.set_fuel(fuel)
    try:
        module = wasmtime.Module.from_file(engine, module_path)
    except (wasmtime.WasmtimeError, OSError) as exc:
        _fail(f"cannot compile {module_path}: {exc}")
    try:
        if abi == "wasi":
            _run_wasi(wasmtime, engine, store, module)
        else:
            _run_abi(wasmtime, store, module, output_max)
    except wasmtime.ExitTrap as exc:
        sys.stdout.flush()
        sys.exit(exc.code)
    except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
        _fail(_trap_message(exc, fuel, memory_bytes))


def _run_wasi(wasmtime, engine, store, module) -> None:  # type: ignore[no-untyped-def]
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["tool"]
    wasi.inherit_stdin()
    wasi.inherit_stdout()
    wasi.inherit_stderr()
    store.set_wasi(wasi)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    instance = linker.instantiate(store, module)
    start = instance.exports(store).get("_start")
    if not isinstance(start, wasmtime.Func):
        _fail("it exports no function _start")
    start(store)


def _run_abi(wasmtime, store, module, output_max: int) -> None:  # type: ignore[no-untyped-def]
    document = sys.stdin.buffer.read()
    instance = wasmtime.Instance(store, module, [])
    exports = instance.exports(store)
    run, memory = exports.get("run"), exports.get("memory")
    if not isinstance(run, wasmtime.Func) or not isinstance(memory, wasmtime.Memory):
        _fail("it must export a function run and its memory")
    base = memory.data_len(store)
    pages = -(-(len(document) + output_max + 8) // _PAGE)
    try:
        memory.grow(store, pages)
    except wasmtime.WasmtimeError:
        _fail(f"its memory cannot grow by {pages} pages for the input and output buffers (its memory cap)")
    input_ptr = base
    output_ptr = base + ((len(document) + 7) // 8) * 8
    memory.write(store, document, input_ptr)
    written = run(store, input_ptr, len(document), output_ptr, output_max)
    if not isinstance(written, int):
        _fail("run must return one i32: the number of output bytes it wrote")
    if written < 0:
        _fail(f"run returned {written}: the module reports a failure")
    if written > output_max:
        _fail(f"run claims {written} bytes of output, more than output_max ({output_max})")
    sys.stdout.buffer.write(memory.read(store, output_ptr, output_ptr + written))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
