"""Two echo modules in the text format, one per wasm tool ABI: the tests and bench/wasm_tool.py run both."""

WASI_ECHO = """
(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 60000))
    (drop (call $read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 16)))
    (i32.store (i32.const 4) (i32.load (i32.const 16)))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 20)))))
"""

RUN_ECHO = """
(module
  (memory (export "memory") 1)
  (func (export "run") (param $in i32) (param $len i32) (param $out i32) (param $max i32) (result i32)
    (memory.copy (local.get $out) (local.get $in) (local.get $len))
    (local.get $len)))
"""
