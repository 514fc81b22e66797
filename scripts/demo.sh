#!/usr/bin/env bash
# covenant's main job on a throwaway home: start the daemon with the example agents,
# show a denied dispatch and its grant hint, grant, dispatch to each runtime and to a Rune
# agent whose workflow branches on each ticket's category (its model: the project's stand-in, started
# here), verify the signed audit log, stop cleanly, and end with one line saying what ran, counted
# from the audit log. Run by `make demo` (`make demo-real`: a real small model instead).
#
# Every command is printed before it runs, after `$ `, quoted for the shell: a line can be pasted
# into a terminal (after the printed `export` line) to run it again.
set -euo pipefail
cd "$(dirname "$0")/.."
covenant=${COVENANT:-.venv/bin/covenant}
python=${COVENANT_PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
work=$(mktemp -d /tmp/covenant-demo.XXXXXX)
# mktemp makes it 0700; the Rune agent's replica runs under its own uid and must traverse it to its
# socket in the home (docs/security.md: the home is 0711, and so must be every folder above it).
chmod 0711 "$work"
export COVENANT_HOME="$work/home" XDG_CONFIG_HOME="$work/xdg" COVENANT_SOCKET="$work/covenant.sock"
daemon_pid=
source scripts/demo_model.sh
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then kill -TERM "$daemon_pid"; wait "$daemon_pid" || true; fi
  demo_model_stop
  rm -rf "$work"
}
trap cleanup EXIT
# Headings in bold on a terminal only: piped or captured, the output holds no escape codes.
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold= plain=; fi
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
# One word as the shell reads it back: bare when it holds no special character, else in single quotes.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then printf '%s' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
show() { local out= word; for word in "$@"; do out+="${out:+ }$(quote "$word")"; done; printf '$ %s\n' "$out"; }
run() { show "$@"; "$@"; }

step "a fresh home, with the repository's agents.d/ as its agents folder"
show export "COVENANT_HOME=$COVENANT_HOME" "XDG_CONFIG_HOME=$XDG_CONFIG_HOME" "COVENANT_SOCKET=$COVENANT_SOCKET"
run "$covenant" init --display demo@local
config="agents_dir = \"$PWD/agents.d\""
# The examples declare network = "off". covenant refuses to run them where it cannot make a
# network namespace (fail closed); for this demo only, say so and run them without one.
if ! unshare -n true 2>/dev/null && ! unshare -U -n true 2>/dev/null; then
  echo "NOTE: this host cannot create network namespaces for this user; the demo sets"
  echo "      [runtime] network_enforcement = \"advisory\" so network = \"off\" is recorded, not enforced."
  config+=$'\n\n[runtime]\nnetwork_enforcement = "advisory"'
fi
# The Rune agent's model. The daemon never starts a model server: the demo starts the project's
# stand-in (or, with COVENANT_DEMO_MODEL=real, SmolLM2 via llama.cpp) and names it [providers.local],
# which agents.d/triage-rune lists after anthropic and openai.
demo_model_start "$work" "$python"
config+=$'\n\n'"$DEMO_MODEL_TOML"
printf "\$ printf '%%s\\\\n' %s > %s\n" "$(quote "$config")" "$(quote "$COVENANT_HOME/covenant.toml")"
printf '%s\n' "$config" > "$COVENANT_HOME/covenant.toml"
set +e
run "$covenant" agents check
checked=$?
set -e
[ "$checked" = 0 ] || echo "(some example agents are not usable here; covenant says why above)"

step "start the daemon, in the background (its log goes to a file)"
printf '%s &\n' "$(show "$covenant" daemon --log-target "file:$work/daemon.log")"
"$covenant" daemon --log-target "file:$work/daemon.log" &
daemon_pid=$!
printf '$ %s\n' "for _ in \$(seq 1 100); do $(quote "$covenant") status >/dev/null 2>&1 && break; sleep 0.1; done"
for _ in $(seq 1 100); do "$covenant" status >/dev/null 2>&1 && break; sleep 0.1; done
run "$covenant" status

step "a dispatch without a grant is denied before anything runs (exit 3)"
set +e
run "$covenant" dispatch "count the words in this sentence"
echo "exit code: $?"
set -e

step "grant the demo identity what the example agents require"
run "$covenant" grant demo@local tool.text_stats tool.calculate tool.search_files
run "$covenant" grants

step "dispatch to each runtime (routed by keywords)"
run "$covenant" dispatch "count the words in this sentence please"
if command -v node >/dev/null; then run "$covenant" dispatch "calculate (2 + 3) * 7"; else echo "node not installed: skipping calc@local"; fi
if [ -x agents.d/search-rs/target/release/search-rs ]; then run "$covenant" dispatch "search for signed checkpoints"; else echo "search-rs not built (needs cargo): skipping search@local"; fi
run "$covenant" history --limit 5

step "a Rune agent: the daemon asks the model (the stand-in, or SmolLM2 with make demo-real), runs the tool it calls, audits both"
echo "triage@local's workflow.yaml: classify the ticket (the model calls classify_ticket), then only the"
echo "branch its answer names (technical: search@local, billing: triage@local again), and size: wordcount@local."
run "$covenant" grant demo@local tool.classify_ticket tool.web_fetch
run "$covenant" dispatch --dry-run --agent triage@local "I was charged twice this month"
for ticket in "I was charged twice for my subscription this month, please refund one" \
              "The memory limit keeps killing my job"; do
  if [ "${COVENANT_DEMO_MODEL:-standin}" = real ]; then
    # A 135M-parameter model often fumbles tool calls; show the outcome and go on.
    run "$covenant" dispatch --agent triage@local "$ticket" || echo "(exit code $?: the small model did not finish)"
  else
    run "$covenant" dispatch --agent triage@local "$ticket"
  fi
done
run "$covenant" history --limit 8
run "$covenant" audit tail --type model.call
run "$covenant" audit tail --type tool.call
echo "(each model call's tokens count against the intent's models.token_budget, 50000 for triage; no prompt text is logged)"
run "$covenant" audit tail --type model.call -n 1 --json

step "stop the daemon (SIGTERM drains in-flight dispatches)"
show kill -TERM "$daemon_pid"
kill -TERM "$daemon_pid"; wait "$daemon_pid"; echo "daemon exit code: $?"; daemon_pid=

step "the signed audit log"
run "$covenant" audit tail
run "$covenant" audit verify

step "next: your own home"
case "$covenant" in /*) cli=$covenant ;; *) cli=$PWD/${covenant#./} ;; esac
echo "The CLI is $(quote "$cli"); this demo's home is removed when it ends. For a home of your own:"
echo "  $(quote "$cli") init                 # ~/.covenant (or --home DIR, or env COVENANT_HOME)"
echo "  $(quote "$cli") daemon               # foreground; put manifests in ~/.covenant/agents"

step "what ran, counted from the audit log"
printf '$ %s | %s\n' "$(show "$covenant" audit tail --json --type '*' -n 1000000 | cut -c3-)" "$(show "$python" scripts/demo_summary.py | cut -c3-)"
"$covenant" audit tail --json --type '*' -n 1000000 | "$python" scripts/demo_summary.py
