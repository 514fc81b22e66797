"""[providers.NAME] in covenant.toml: valid tables load, mistakes name the file and the key."""

from __future__ import annotations

import pytest

from covenant.config import load_config
from covenant.errors import ConfigError
from covenant.home import Home


def write(home: Home, text: str) -> None:
    home.config_path.write_text(text)


def test_providers_load_with_defaults(home: Home) -> None:
    write(home, """
[providers.openai]
kind = "openai"
base_url = "https://api.openai.com/v1/"
api_key_env = "OPENAI_API_KEY"

[providers.ollama]
kind = "openai"
base_url = "http://localhost:11434/v1"
timeout_s = 300
""")
    providers = load_config(home).providers
    assert providers["openai"].base_url == "https://api.openai.com/v1"
    assert providers["openai"].timeout_s == 120 and providers["openai"].api_key_env == "OPENAI_API_KEY"
    assert providers["ollama"].api_key_env is None and providers["ollama"].timeout_s == 300


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('kind = "openai"\nbase_url = "http://x/v1"\napi_key = "sk-1"',
         ":4: [providers.p] api_key: unknown key (did you mean 'api_key_env'?"),
        ('kind = "gemini"\nbase_url = "http://x/v1"', ":2: [providers.p] kind: must be one of 'openai' or 'anthropic'"),
        ('kind = "openai"\nbase_url = "file:///etc/passwd"', ":3: [providers.p] base_url: 'file:///etc/passwd' must be an http"),
        ('kind = "openai"', ":1: [providers.p] base_url: is required"),
        ('kind = "openai"\nbase_url = "http://x"\napi_key_env = "sk-live-abc"',
         ":4: [providers.p] api_key_env: must be the name of an environment variable"),
        ('kind = "openai"\nbase_url = "http://x"\ntimeout_s = 0', ":4: [providers.p] timeout_s: must be greater than 0"),
    ],
)
def test_a_bad_table_names_the_file_and_key(home: Home, table: str, expected: str) -> None:
    write(home, f"[providers.p]\n{table}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(home)
    assert str(home.config_path) in caught.value.message
    assert expected in caught.value.message
    assert "sk-live-abc" not in caught.value.message, "a key pasted where its variable's name goes is not repeated"


def test_a_bad_provider_name_is_refused(home: Home) -> None:
    write(home, '[providers."open ai"]\nkind = "openai"\nbase_url = "http://x"\n')
    with pytest.raises(ConfigError, match=r"\[providers.open ai\]: a provider name is"):
        load_config(home)
