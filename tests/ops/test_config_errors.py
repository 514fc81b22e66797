"""covenant.toml mistakes are reported in covenant's words: file, line, key, and what to write (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from covenant.config import load_config
from covenant.errors import ConfigError
from covenant.home import Home

PYDANTIC_WORDING = ("Input should", "Extra inputs", "validation error", "pydantic", "type=", "For further information")


def _write(home: Home, text: str) -> None:
    home.config_path.write_text(textwrap.dedent(text))


def _message(home: Home) -> str:
    with pytest.raises(ConfigError) as raised:
        load_config(home)
    message = raised.value.message
    for leak in PYDANTIC_WORDING:
        assert leak not in message
    return message


def test_a_typo_names_file_line_key_and_the_accepted_keys(home: Home) -> None:
    _write(home, """\
        [daemon]
        max_concurrent = 4
        queue_mx = 5
        """)
    message = _message(home)
    assert message.splitlines()[0] == (
        f"{home.config_path}:3: [daemon] queue_mx: unknown key (did you mean 'queue_max'? accepted keys here: "
        "max_concurrent, per_agent_concurrent, queue_max, drain_timeout_s)"
    )
    assert "docs/configuration.md" in message


def test_each_kind_of_bad_value_says_what_to_write(home: Home) -> None:
    _write(home, """\
        agnets_dir = "x"
        [runtime]
        env_allow = "HOME"
        pdeathsig = "yes"
        [daemon]
        queue_max = -1
        drain_timeout_s = "soon"
        [log]
        level = "loud"
        [audit]
        pubkey = 5
        """)
    lines = _message(home).splitlines()
    path = home.config_path
    assert lines[:-1] == [
        f"{path}:1: agnets_dir: unknown key (did you mean 'agents_dir'? accepted keys here: agents_dir, socket, "
        "default_agent, runtime, audit, policy, daemon, log, rune, providers, isolation, mcp, tools, channels, webhooks, a2a, fleet, schedules)",
        f"{path}:3: [runtime] env_allow: must be an array, [ … ], got 'HOME'",
        f"{path}:4: [runtime] pdeathsig: must be true or false (without quotes), got 'yes'",
        f"{path}:6: [daemon] queue_max: must be at least 0, got -1",
        f"{path}:7: [daemon] drain_timeout_s: must be a number (written without quotes), got 'soon'",
        f"{path}:9: [log] level: must be one of 'debug', 'info', 'warning' or 'error', got 'loud'",
        f"{path}:11: [audit] pubkey: must be a string in quotes, got 5",
    ]


def test_a_section_written_as_a_value(home: Home) -> None:
    _write(home, "runtime = 5\n")
    assert _message(home).splitlines()[0] == f"{home.config_path}:1: [runtime]: must be a table, got 5"


def test_the_daemon_refuses_to_start_with_the_message_and_exit_2(home: Home) -> None:
    _write(home, """\
        [log]
        levle = "debug"
        """)
    result = subprocess.run([sys.executable, "-m", "covenant", "daemon"], env=dict(os.environ),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"{home.config_path}:2: [log] levle: unknown key (did you mean 'level'?" in result.stderr
    for leak in PYDANTIC_WORDING:
        assert leak not in result.stderr


def test_bad_toml_syntax_says_where_and_to_fix_it(home: Home) -> None:
    _write(home, "[daemon\n")
    with pytest.raises(ConfigError, match=r"covenant.toml: not valid TOML: .*line 1.*; fix the syntax there"):
        load_config(home)


def test_provider_tables_and_whole_table_checks_name_their_table(home: Home) -> None:
    _write(home, """\
        [providers.local]
        kind = "openai"
        base_url = "ftp://x"
        timeout = 5

        [isolation]
        uid_range = [5, 1]
        """)
    lines = _message(home).splitlines()
    path = home.config_path
    assert lines[0].startswith(f"{path}:3: [providers.local] base_url: 'ftp://x' must be an http:// or https:// URL")
    assert lines[1].startswith(f"{path}:4: [providers.local] timeout: unknown key (did you mean 'timeout_s'?")
    assert lines[2].startswith(f"{path}:6: [isolation]: uid_range = [5, 1]: must be [low, high]")


def test_a_start_with_three_kinds_of_problem_names_all_three_and_exits_2(home: Home) -> None:
    """A wrong value, a schedule whose issuer is unknown and a webhook route whose secret is unset: one start
    names all three (each with the file and what to fix), not three starts one each; nothing is left behind."""
    _write(home, """\
        [daemon]
        queue_max = "lots"

        [[schedules]]
        name = "nightly"
        agent = "digest@local"
        every = "1h"
        issuer = "nobody@nowhere"

        [webhooks]
        listen = "127.0.0.1:8787"

        [[webhooks.routes]]
        path = "/hooks/deploy"
        agent = "deploy@local"
        issuer = "nobody@nowhere"
        secret_env = "COVENANT_TEST_UNSET_SECRET"
        """)
    env = {k: v for k, v in os.environ.items() if k != "COVENANT_TEST_UNSET_SECRET"}
    result = subprocess.run([sys.executable, "-m", "covenant", "daemon"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert f"{home.config_path}:2: [daemon] queue_max: must be an integer" in err
    assert f"{home.config_path}: [[schedules]] 'nightly': issuer 'nobody@nowhere' is not a display name" in err
    assert f"{home.config_path}: [[webhooks.routes]] /hooks/deploy: issuer 'nobody@nowhere'" in err
    assert f"{home.config_path}: [[webhooks.routes]] /hooks/deploy: the daemon's environment has no " \
           "COVENANT_TEST_UNSET_SECRET" in err
    assert err.count("docs/configuration.md") == 1  # the hint once, after the list
    assert not (home.root / "run" / "covenant.sock").exists()
    for leak in PYDANTIC_WORDING:
        assert leak not in err


def test_problems_of_the_names_alone_are_all_named_too(home: Home) -> None:
    """A file that validates, with two A2A clients and a schedule that name what is not there."""
    _write(home, """\
        [[schedules]]
        name = "a"
        agent = "x@local"
        every = "1h"
        issuer = "ghost-1"

        [[a2a.clients]]
        name = "partner"
        issuer = "ghost-2"
        token_env = "COVENANT_TEST_UNSET_TOKEN"
        """)
    result = subprocess.run([sys.executable, "-m", "covenant", "daemon"],
                            env={k: v for k, v in os.environ.items() if k != "COVENANT_TEST_UNSET_TOKEN"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "'a': issuer 'ghost-1'" in result.stderr
    assert "[[a2a.clients]] partner: issuer 'ghost-2'" in result.stderr
    assert "[[a2a.clients]] partner: the daemon's environment has no COVENANT_TEST_UNSET_TOKEN" in result.stderr
