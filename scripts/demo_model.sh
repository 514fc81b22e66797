# Sourced by scripts/demo.sh (bash): the model server the demo's Rune agent talks to, and the
# [providers.local] table that points covenant at it. The daemon never starts a model server;
# the demo does, here, and stops it on exit.
#
#   COVENANT_DEMO_MODEL=standin (default)  the project's stand-in (scripts/standin_model.py):
#                                          rule-based, deterministic, labelled, instant
#   COVENANT_DEMO_MODEL=real               SmolLM2-135M via llama-cpp-python's server on 127.0.0.1:8081
#                                          (COVENANT_REAL_MODEL_PORT): refused when that port is taken;
#                                          scripts/real_model.sh install, once; make demo-real
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
      # Whatever already listens there would answer the demo's model calls under this model's name.
      _demo_model_port_free "$python" "$port" || return 1
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
  # Ready when the server started here still runs and $base/models lists $model: a server that exited
  # (its port taken after the check above, a failed load) is a failure, never a reason to use another.
  local ready=
  for _ in $(seq 1 3000); do
    kill -0 "$DEMO_MODEL_PID" 2>/dev/null || { echo "the $kind model server exited:" >&2; cat "$work/model.log" >&2; return 1; }
    _demo_model_serves "$python" "$base" "$model" && { ready=1; break; }
    sleep 0.1
  done
  [ -n "$ready" ] || { echo "the $kind model server did not serve $model at $base within 300 s:" >&2; cat "$work/model.log" >&2; return 1; }
  DEMO_MODEL_TOML=$(printf '[providers.local]\nkind = "openai"\nbase_url = "%s"\nmodel = "%s"\ntimeout_s = %s' \
    "$base" "$model" "$timeout_s")
  echo "model server ($kind): $base, model $model, pid $DEMO_MODEL_PID"
}

# Is 127.0.0.1:PORT free to listen on? Else say so, and what to do, on stderr.
_demo_model_port_free() {
  "$1" - "$2" <<'PY'
import errno, socket, sys
port = int(sys.argv[1])
with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no obstacle
    try:
        probe.bind(("127.0.0.1", port))
    except OSError as exc:
        why = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        sys.exit(f"127.0.0.1:{port} is {why}: the real model cannot listen there, and whatever answers there "
                 f"would answer the demo in its name. Stop it, or pick a free port: "
                 f"COVENANT_REAL_MODEL_PORT=N make demo-real")
PY
}

# Does BASE/models answer 200 and list MODEL?
_demo_model_serves() {
  "$1" - "$2" "$3" 2>/dev/null <<'PY'
import json, sys, urllib.request
base, model = sys.argv[1], sys.argv[2]
with urllib.request.urlopen(base + "/models", timeout=2) as answer:
    ids = [entry.get("id") for entry in json.load(answer).get("data") or []]
sys.exit(model not in ids)
PY
}

demo_model_stop() {
  if [ -n "$DEMO_MODEL_PID" ] && kill -0 "$DEMO_MODEL_PID" 2>/dev/null; then
    kill -TERM "$DEMO_MODEL_PID"
    wait "$DEMO_MODEL_PID" 2>/dev/null || true
  fi
  DEMO_MODEL_PID=
}
