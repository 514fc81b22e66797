#!/usr/bin/env bash
# Assemble one of covenant's static exec helpers from its listing in covenant/runtime/asm/ and print
# its code as hex on one line. Needs GNU binutils (`as`, `objcopy`; Debian package binutils).
#
#   scripts/helper-bytes.sh pdeathsig PID [CREDENTIALS]   the PDEATHSIG helper for covenant pid PID
#   scripts/helper-bytes.sh uidkill                       the uid sweep helper
#
# tests/runtime/test_helper_sources.py runs this and checks the bytes equal what covenant runs.
set -euo pipefail
name=${1:?usage: scripts/helper-bytes.sh pdeathsig PID [CREDENTIALS] | uidkill}
asm=$(cd "$(dirname "$0")/.." && pwd)/covenant/runtime/asm
defs=()
case $name in
  pdeathsig) defs+=(--defsym "COVENANT_PID=${2:?the covenant pid}")
             if [ "${3:-}" = CREDENTIALS ]; then defs+=(--defsym CREDENTIALS=1); fi ;;
  uidkill) ;;
  *) echo "unknown helper: $name" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
as --64 -I "$asm" "${defs[@]}" -o "$work/helper.o" "$asm/$name.S"
objcopy -O binary --only-section=.text "$work/helper.o" "$work/helper.bin"
od -An -v -tx1 "$work/helper.bin" | tr -d ' \n'
echo
