"""rune@location-get: answered from [tools.location] only, unavailable (with the reason) until it is set."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from covenant.config import Config, load_config
from covenant.errors import ConfigError
from covenant.home import Home

from .conftest import Tools, _tools


@pytest.fixture
async def located(home: Home, tmp_path: Path) -> AsyncIterator[Tools]:
    config = Config.model_validate({"tools": {"location": {"latitude": 52.52, "longitude": 13.405, "city": "Berlin",
                                                           "timezone": "Europe/Berlin"}}})
    async with _tools(home, tmp_path, config) as made:
        yield made


async def test_it_answers_exactly_what_the_operator_configured(located: Tools) -> None:
    agent = located.package("where", ["rune@location-get"])
    assert [t["function"]["name"] for t in located.host.offered(agent)] == ["location-get"]
    result = await located.host.call(located.ctx(agent, located.grant("tool.location_get")), "location-get", {})
    assert result.ok, result
    # No country was set, so none is given: nothing is looked up or guessed.
    assert result.content == {"latitude": 52.52, "longitude": 13.405, "city": "Berlin", "timezone": "Europe/Berlin",
                              "source": "configured"}
    extra = await located.host.call(located.ctx(agent), "location-get", {"precise": True})
    assert extra.error_code == "invalid_arguments"


async def test_unconfigured_it_is_unavailable_with_the_reason(tools: Tools) -> None:
    agent = tools.package("where", ["rune@location-get", "rune@system-time"])
    assert [t["function"]["name"] for t in tools.host.offered(agent)] == ["system-time"]
    reason = dict(tools.host.unavailable(agent))["rune@location-get"]
    assert reason.startswith("needs [tools.location] in covenant.toml")
    called = await tools.host.call(tools.ctx(agent, tools.grant("tool.*")), "location-get", {})
    assert called.error_code == "unknown_tool"


@pytest.mark.parametrize(("section", "words"), [
    ({"latitude": 10.0}, "latitude and longitude together"),
    ({"latitude": 91, "longitude": 0}, "must be at most 90"),
    ({"timezone": "Mars/Olympus_Mons"}, "not an IANA time zone"),
    ({"city": "Berlin", "altitude": 34}, "altitude"),
])
def test_a_bad_section_is_a_config_error_naming_the_field(home: Home, section: dict[str, object], words: str) -> None:
    body = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in section.items())
    (home.root / "covenant.toml").write_text("[tools.location]\n" + body)
    with pytest.raises(ConfigError) as raised:
        load_config(home)
    assert words in str(raised.value) and "location" in str(raised.value) and "covenant.toml" in str(raised.value)
