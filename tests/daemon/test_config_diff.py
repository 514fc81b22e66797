"""Which covenant.toml keys a reload applies and which wait for a restart (covenant.daemon.config_diff), pure."""

from __future__ import annotations

import json
from typing import Any

from covenant.config import Config, McpServerConfig
from covenant.daemon.config_diff import changed_keys, plan_reload


def _config(raw: dict[str, Any]) -> Config:
    return Config.model_validate_json(json.dumps(raw), strict=True)


BASE = {
    "default_agent": "a@local",
    "runtime": {"kill_grace_ms": 2000},
    "providers": {"local": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
    "mcp": {"clock": {"command": ["/usr/bin/clock-server"]}},
    "schedules": [{"name": "tick", "agent": "a@local", "every": "5s", "issuer": "ops@box"}],
    "webhooks": {"listen": "127.0.0.1:8787", "skew_s": 60, "max_body_kb": 4,
                 "routes": [{"path": "/hooks/a", "agent": "a@local", "issuer": "ops@box", "secret_env": "HOOK_A"}]},
    "a2a": {"listen": "127.0.0.1:8788", "expose": ["a"],
            "clients": [{"name": "ci", "token_env": "TOKEN_CI", "issuer": "ops@box"}]},
    "isolation": {"uid_range": [70000, 71000]},
}


def _with(**changes: Any) -> dict[str, Any]:
    raw = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        table = raw
        for part in parents:
            table = table.setdefault(part, {})
        table[last] = value
    return raw


def test_an_unchanged_file_changes_nothing_and_the_running_config_is_kept_as_it_is() -> None:
    running = _config(BASE)
    plan = plan_reload(running, _config(BASE))
    assert (plan.changed, plan.needs_restart) == ((), ())
    assert plan.config == running


def test_live_keys_apply_and_restart_keys_keep_their_running_value() -> None:
    running = _config(BASE)
    new = _config(_with(
        default_agent="b@local",
        providers={"local": BASE["providers"]["local"],
                   "other": {"kind": "anthropic", "base_url": "https://api.example.com", "api_key_env": "OTHER_KEY"}},
        webhooks__listen="127.0.0.1:9999",
        webhooks__skew_s=600,
        webhooks__max_body_kb=8,
        webhooks__routes=[{"path": "/hooks/b", "agent": "a@local", "issuer": "ops@box", "secret_env": "HOOK_B"}],
        a2a__expose=["a", "b"],
        a2a__max_connections=5,
        runtime__kill_grace_ms=100,
        isolation__uid_range=[80000, 81000],
        audit__pubkey="ab" * 32,
        audit__store_text=True,
    ))
    plan = plan_reload(running, new)
    assert plan.changed == ("default_agent", "audit.pubkey", "providers.other", "webhooks.max_body_kb",
                            "webhooks.routes[/hooks/a]", "webhooks.routes[/hooks/b]", "a2a.expose")
    assert plan.needs_restart == ("runtime.kill_grace_ms", "audit.store_text", "isolation.uid_range",
                                  "webhooks.listen", "webhooks.skew_s", "a2a.max_connections")
    effective = plan.config
    assert effective.default_agent == "b@local" and set(effective.providers) == {"local", "other"}
    assert effective.webhooks.listen == "127.0.0.1:8787" and effective.webhooks.skew_s == 60
    assert effective.webhooks.max_body_kb == 8 and [r.path for r in effective.webhooks.routes] == ["/hooks/b"]
    assert effective.a2a.expose == ("a", "b") and effective.a2a.max_connections == running.a2a.max_connections
    assert effective.runtime == running.runtime and effective.isolation == running.isolation
    assert effective.audit.store_text is False and effective.audit.pubkey == "ab" * 32
    # Asked again with the same file, the waiting keys are named again and nothing else has changed.
    again = plan_reload(effective, new)
    assert again.changed == () and again.needs_restart == plan.needs_restart


def test_array_entries_are_named_by_name_or_path_and_a_changed_entry_once() -> None:
    running = _config(BASE)
    new = _config(_with(
        schedules=[{"name": "tick", "agent": "a@local", "every": "9s", "issuer": "ops@box"},
                   {"name": "nightly", "agent": "a@local", "cron": "0 3 * * *", "issuer": "ops@box"}],
        a2a__clients=[],
    ))
    assert changed_keys(running, new) == ["a2a.clients[ci]", "schedules[tick]", "schedules[nightly]"]
    assert plan_reload(running, new).needs_restart == ()


def test_an_mcp_server_the_agents_private_tmp_cannot_show_waits_for_a_restart() -> None:
    running = _config(BASE)
    new = _config(_with(mcp={"clock": {"command": ["/tmp/elsewhere/clock-server"]},
                             "notes": {"command": ["/usr/bin/notes-server"]}}))

    def under_tmp(server: McpServerConfig) -> bool:
        return server.command[0].startswith("/tmp/")

    plan = plan_reload(running, new, mcp_needs_restart=under_tmp)
    assert plan.changed == ("mcp.notes",) and plan.needs_restart == ("mcp.clock",)
    assert plan.config.mcp["clock"] == running.mcp["clock"]  # the running table stays
    assert set(plan.config.mcp) == {"clock", "notes"}
    # A server added under /tmp is not run at all until the restart; a removed one goes at once.
    plan = plan_reload(running, _config(_with(mcp={"odd": {"command": ["/tmp/odd"]}})), mcp_needs_restart=under_tmp)
    assert plan.changed == ("mcp.clock",) and plan.needs_restart == ("mcp.odd",) and plan.config.mcp == {}
