# Sourced by scripts/demo.sh (bash): the model server the demo's Rune agent talks to, and the
# [providers.local] table that points covenant at it. The daemon never starts a model server;
# the demo does, here, and stops it on exit.
#
#   COVENANT_DEMO_MODEL=standin (default)  the project's stand-in (scripts/standin_model.py):
#                                          rule-based, deterministic, labelled, instant
#   COVENANT_DEMO_MODEL=real               SmolLM2-135M via llama-cpp-python's server
#                                          (scripts/real_model.sh install, once)
#
# demo_model_start WORKDIR PYTHON   start it, wait until it answers, append [providers.local]
#                                   to $COVENANT_HOME/covenant.toml; sets DEMO_MODEL_PID
# demo_model_stop                   stop it (SIGTERM, then wait)

DEMO_MODEL_PID=

demo_model_start() {
  local work=$1 python=$2 kind=${COVENANT_DEMO_MODEL:-standin} port model timeout_s base
  case "$kind" in
    standin)
      "$python" scripts/standin_model.py --port-file "$work/model.port" 2>"$work/model.log" &
      DEMO_MODEL_PID=$!
      model=covenant-stand-in-model timeout_s=30
      for _ in $(seq 1 200); do [ -s "$work/model.port" ] && break; sleep 0.05; done
      [ -s "$work/model.port" ] || { echo "the stand-in model did not start:" >&2; cat "$work/model.log" >&2; return 1; }
      port=$(cat "$work/model.port")
      ;;
    real)
      port=${COVENANT_REAL_MODEL_PORT:-8081}
      scripts/real_model.sh serve "$port" >"$work/model.log" 2>&1 &
      DEMO_MODEL_PID=$!
      model=smollm2-135m timeout_s=300
      ;;
    *)
      echo "COVENANT_DEMO_MODEL must be standin or real, not '$kind'" >&2
      return 2
      ;;
  esac
  base="http://127.0.0.1:$port/v1"
  for _ in $(seq 1 1200); do
    "$python" -c "import sys, httpx; sys.exit(httpx.get('$base/models', timeout=2).status_code != 200)" 2>/dev/null && break
    kill -0 "$DEMO_MODEL_PID" 2>/dev/null || { echo "the $kind model server exited:" >&2; cat "$work/model.log" >&2; return 1; }
    sleep 0.1
  done
  printf '\n[providers.local]\nkind = "openai"\nbase_url = "%s"\nmodel = "%s"\ntimeout_s = %s\n' \
    "$base" "$model" "$timeout_s" >> "$COVENANT_HOME/covenant.toml"
  echo "model server ($kind): $base, model $model, pid $DEMO_MODEL_PID"
}

demo_model_stop() {
  if [ -n "$DEMO_MODEL_PID" ] && kill -0 "$DEMO_MODEL_PID" 2>/dev/null; then
    kill -TERM "$DEMO_MODEL_PID"
    wait "$DEMO_MODEL_PID" 2>/dev/null || true
  fi
  DEMO_MODEL_PID=
}
