#!/usr/bin/env bash
# Assemble covenant/runtime/pdeathsig.S for covenant pid PID and print the code as hex, one line.
# Needs GNU binutils (`as`, `objcopy`; Debian package binutils). Used by
# tests/runtime/test_pdeathsig_source.py to prove the bytes in covenant/runtime/pdeathsig.py are
# what the listing assembles to.
set -euo pipefail
pid=${1:?usage: scripts/pdeathsig-bytes.sh PID}
source=$(cd "$(dirname "$0")/.." && pwd)/covenant/runtime/pdeathsig.S
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
as --64 --defsym COVENANT_PID="$pid" -o "$work/helper.o" "$source"
objcopy -O binary --only-section=.text "$work/helper.o" "$work/helper.bin"
od -An -v -tx1 "$work/helper.bin" | tr -d ' \n'
echo
