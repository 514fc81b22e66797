"""``rune@location-get``: where this host is, as the operator wrote it in ``[tools.location]``.

The reference runtime guesses a location from the host's IP address; covenant
never does (a guess sent to a model reads as a fact, and asking a geolocation
service would leak the host's address). The tool is available only once
``[tools.location]`` sets at least one field, and answers exactly the fields
set: nothing is derived, looked up or filled in.
"""

from __future__ import annotations

from typing import Any

from covenant.config import Config
from covenant.tools.builtins.base import NO_ARGUMENTS, Builtin, BuiltinCall

__all__ = ["TOOL"]


def _needs(config: Config) -> str | None:
    if not config.tools.location.configured():
        return ("needs [tools.location] in covenant.toml (latitude and longitude, city, country, timezone: "
                "what the operator knows; covenant never guesses a location)")
    return None


async def _locate(call: BuiltinCall) -> dict[str, Any]:
    return {**call.services.config.tools.location.configured(), "source": "configured"}


TOOL = Builtin(
    name="rune@location-get",
    description=("Where this host is, as its operator configured it: any of latitude, longitude (decimal degrees), "
                 "city, country and timezone (IANA). Fields the operator did not set are absent."),
    parameters=NO_ARGUMENTS,
    run=_locate,
    needs=_needs,
)
