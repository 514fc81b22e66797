# Sourced by scripts/demo.sh (bash): the model server the demo's Rune agent talks to, and the
# [providers.local] table that points covenant at it. The daemon never starts a model server;
# the demo does, here, and stops it on exit.
#
#   COVENANT_DEMO_MODEL=standin (default)  the project's stand-in (scripts/standin_model.py):
#                                          rule-based, deterministic, labelled, instant
#   COVENANT_DEMO_MODEL=real               SmolLM2-135M via llama-cpp-python's server
#                                          (scripts/real_model.sh install, once; make demo-real)
#
# demo_model_start WORKDIR PYTHON   start it and wait until it answers; sets DEMO_MODEL_PID and
#                                   DEMO_MODEL_TOML (the [providers.local] table for covenant.toml)
# demo_model_stop                   stop it (SIGTERM, then wait)

DEMO_MODEL_PID=
DEMO_MODEL_TOML=

demo_model_start() {
  local work=$1 python=$2 kind=${COVENANT_DEMO_MODEL:-standin} port model timeout_s base
  local command
  case "$kind" in
    standin)
      command=("$python" scripts/standin_model.py --port-file "$work/model.port")
      model=covenant-stand-in-model timeout_s=30
      ;;
    real)
      port=${COVENANT_REAL_MODEL_PORT:-8081}
      command=(scripts/real_model.sh serve "$port")
      model=smollm2-135m timeout_s=300
      ;;
    *)
      echo "COVENANT_DEMO_MODEL must be standin or real, not '$kind'" >&2
      return 2
      ;;
  esac
  if declare -F show >/dev/null; then printf '%s &\n' "$(show "${command[@]}")"; fi
  "${command[@]}" >"$work/model.log" 2>&1 &
  DEMO_MODEL_PID=$!
  if [ "$kind" = standin ]; then
    for _ in $(seq 1 200); do [ -s "$work/model.port" ] && break; sleep 0.05; done
    [ -s "$work/model.port" ] || { echo "the stand-in model did not start:" >&2; cat "$work/model.log" >&2; return 1; }
    port=$(cat "$work/model.port")
  fi
  base="http://127.0.0.1:$port/v1"
  for _ in $(seq 1 3000); do
    "$python" -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('$base/models', timeout=2).status != 200)" \
      2>/dev/null && break
    kill -0 "$DEMO_MODEL_PID" 2>/dev/null || { echo "the $kind model server exited:" >&2; cat "$work/model.log" >&2; return 1; }
    sleep 0.1
  done
  DEMO_MODEL_TOML=$(printf '[providers.local]\nkind = "openai"\nbase_url = "%s"\nmodel = "%s"\ntimeout_s = %s' \
    "$base" "$model" "$timeout_s")
  echo "model server ($kind): $base, model $model, pid $DEMO_MODEL_PID"
}

demo_model_stop() {
  if [ -n "$DEMO_MODEL_PID" ] && kill -0 "$DEMO_MODEL_PID" 2>/dev/null; then
    kill -TERM "$DEMO_MODEL_PID"
    wait "$DEMO_MODEL_PID" 2>/dev/null || true
  fi
  DEMO_MODEL_PID=
}
