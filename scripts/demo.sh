#!/usr/bin/env bash
# covenant's main job on a throwaway home: start the daemon with the example agents,
# show a denied dispatch and its grant hint, grant, dispatch to each runtime,
# verify the signed audit log, and stop cleanly. Run by `make demo`.
#
# Every command is printed before it runs, after `$ `, quoted for the shell: a line can be pasted
# into a terminal (after the printed `export` line) to run it again.
set -euo pipefail
cd "$(dirname "$0")/.."
covenant=${COVENANT:-.venv/bin/covenant}
work=$(mktemp -d /tmp/covenant-demo.XXXXXX)
export COVENANT_HOME="$work/home" XDG_CONFIG_HOME="$work/xdg" COVENANT_SOCKET="$work/covenant.sock"
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then kill -TERM "$daemon_pid"; wait "$daemon_pid" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
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

step "stop the daemon (SIGTERM drains in-flight dispatches)"
show kill -TERM "$daemon_pid"
kill -TERM "$daemon_pid"; wait "$daemon_pid"; echo "daemon exit code: $?"; daemon_pid=

step "the signed audit log"
run "$covenant" audit tail
run "$covenant" audit verify

step "next: your own home"
echo "The CLI is $(quote "$PWD/${covenant#./}"); this demo's home is removed now. For a home of your own:"
echo "  $(quote "$PWD/${covenant#./}") init                 # ~/.covenant (or --home DIR, or env COVENANT_HOME)"
echo "  $(quote "$PWD/${covenant#./}") daemon               # foreground; put manifests in ~/.covenant/agents"
