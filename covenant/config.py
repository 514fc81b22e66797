"""covenant.toml: the daemon's configuration, every key with a working default.

Unknown keys are errors (a typo must not silently fall back to a default).
Documented in docs/configuration.md; keep the two in step.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from covenant.triggers.config import ScheduleConfig
from covenant.a2a.config import A2AConfig
from covenant.fleet.config import FleetConfig
from covenant.triggers.webhook_config import WebhooksConfig
from covenant.errors import ConfigError
from covenant.home import Home
from covenant.toml_lines import key_line

__all__ = [
    "Config",
    "RuntimeConfig",
    "AuditConfig",
    "PolicyConfig",
    "DaemonConfig",
    "LogConfig",
    "RuneConfig",
    "ProviderConfig",
    "IsolationConfig",
    "ToolsConfig",
    "FilesToolConfig",
    "ShellExecToolConfig",
    "WebFetchToolConfig",
    "ProcessToolConfig",
    "BrowserToolConfig",
    "McpServerConfig",
    "WebSearchToolConfig",
    "ChannelConfig",
    "load_config",
    "default_python3",
]


def default_python3() -> str:
    """The real interpreter behind this process, not a venv or pyenv shim.

    A pyenv shim costs ~75 ms per spawn; a venv interpreter would hand agents
    covenant's own site-packages. ``sys._base_executable`` is the base install.
    """
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RuntimeConfig(_Section):
    """How agents are spawned and supervised."""

    python3: str = Field(default_factory=default_python3, description="interpreter for runtime = python3")
    node: str = Field("node", description="interpreter for runtime = node (resolved on the agent PATH)")
    path: str = Field("/usr/local/bin:/usr/bin:/bin", description="PATH given to agents")
    env_allow: tuple[str, ...] = Field((), description="names of daemon env vars passed through to agents")
    env: dict[str, str] = Field(default_factory=dict, description="fixed variables set for every agent")
    stdout_cap_bytes: int = Field(1024 * 1024, gt=0, le=1 << 30)
    stderr_tail_bytes: int = Field(8192, gt=0, le=1 << 24)
    stderr_log_burst: int = Field(
        1000, ge=1, le=1_000_000, description="stderr lines one process may log at once (docs/runtime.md)"
    )
    stderr_log_lines_per_s: int = Field(
        100, ge=1, le=1_000_000, description="stderr lines one process may log per second past its burst"
    )
    kill_grace_ms: int = Field(2000, ge=0, le=600_000)
    sample_interval_ms: int = Field(50, ge=5, le=10_000)
    network_enforcement: Literal["strict", "advisory"] = "strict"
    wall_grace_ms: int = Field(
        500, ge=0, le=3_600_000, description="wall-clock budget = cpu_ms_per_task + this (docs/runtime.md)"
    )
    pdeathsig: bool = Field(
        True, description="start agents through a PR_SET_PDEATHSIG=SIGKILL wrapper (docs/runtime.md)"
    )
    max_manifest_bytes: int = Field(
        1024 * 1024, ge=1024, le=1 << 30, description="largest manifest or package file read; larger ones are refused unread"
    )
    allow_system_entries: bool = Field(
        False, description="let agent.toml entry name a program outside its package folder (absolute, '..', symlink out)"
    )


class AuditConfig(_Section):
    """The signed audit log (design/audit-log.md)."""

    batch_max: int = Field(512, gt=0, le=100_000, description="most records under one checkpoint and one fdatasync")
    batch_wait_ms: int = Field(
        0,
        ge=0,
        le=1000,
        description="extra wait to grow a batch; 0 = none (records still group while the previous batch syncs)",
    )
    heartbeat_s: int = Field(60, gt=0, le=86_400, description="idle seconds before a heartbeat checkpoint")
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096, description="start a new segment file after this size")
    store_text: bool = Field(False, description="store intent/result text whole instead of sha256+length")
    pubkey: str | None = Field(None, description="pinned daemon public key (hex) for verify")


class PolicyConfig(_Section):
    """Signed intents and grants."""

    skew_s: int = Field(300, gt=0, le=86_400, description="accepted clock skew of issued_at, seconds")
    replay_cache: int = Field(100_000, gt=0, le=10_000_000, description="intent ids remembered for replay checks")


class DaemonConfig(_Section):
    """Concurrency, queueing and shutdown."""

    max_concurrent: int = Field(default_factory=lambda: (os.cpu_count() or 1) * 4, gt=0, le=10_000)
    per_agent_concurrent: int = Field(0, ge=0, le=10_000, description="0 = only the global limit")
    queue_max: int = Field(1000, ge=0, le=1_000_000)
    drain_timeout_s: float = Field(30, ge=0, le=86_400)


def _host_services(value: tuple[str, ...]) -> tuple[str, ...]:
    from covenant.netpolicy import parse_host_service

    for entry in value:
        parse_host_service(entry)
    return value


class IsolationConfig(_Section):
    """Which uid agents run as when the daemon is root (docs/security.md)."""

    uid_range: tuple[int, int] = Field(
        (61184, 65519), description="per-agent uids are allocated from this inclusive range"
    )
    spawned_uids: int = Field(
        256, ge=0, le=1_000_000,
        description="the top this many uids of uid_range (at most an eighth of it) are for agents made by "
        "rune@agent-spawn, and only for them",
    )
    user: str | None = Field(None, min_length=1, description="one fixed account for every agent instead of the range")
    require: bool = Field(False, description="refuse to start unless agents really run as other uids")
    max_processes: int = Field(256, gt=0, le=1_000_000, description="RLIMIT_NPROC of each agent uid")
    tmp_inodes: int = Field(
        65536, ge=1024, le=16_777_216,
        description="most inodes of each agent uid's private /tmp and /dev/shm (and 256 per MiB of disk_mb)",
    )
    operators_group: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="group whose members see every dispatch record (GET /v1/dispatches, history, show)",
    )
    network: Literal["namespaced", "host"] = Field(
        "namespaced",
        description='"host": agents with network that cannot get a namespace of their own here run in the '
        "host's (shown in status); otherwise they are refused",
    )
    host_allow: Annotated[tuple[str, ...], AfterValidator(_host_services)] = Field(
        (), description='host services agents with network may reach, each "ADDRESS:PORT" (e.g. "127.0.0.1:5432")'
    )

    @model_validator(mode="after")
    def _range_is_unprivileged(self) -> "IsolationConfig":
        low, high = self.uid_range
        if not 1000 <= low <= high <= 2**31 - 2:
            raise ValueError(
                f"uid_range = [{low}, {high}]: must be [low, high] with 1000 <= low <= high < 2147483647"
            )
        return self


class LogConfig(_Section):
    """Daemon log output."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["logfmt", "json"] = "logfmt"
    target: str = Field("stderr", description="stderr, stdout or file:PATH")


class RuneConfig(_Section):
    """Hosted Rune agents: replicas and sessions (docs/rune-packages.md)."""

    start: Literal["lazy", "eager"] = Field("lazy", description="start replicas on first dispatch, or at daemon start")
    idle_stop_s: int = Field(600, ge=0, le=7 * 86_400, description="stop a replica idle this long; 0 = never")
    warm: int = Field(0, ge=0, le=1, description="keep a started spare replica process per running replica (0 or 1)")
    standard_turns: int = Field(20, ge=0, le=10_000, description="turns kept by memory_profile = standard")
    skills_dir: str = Field("skills", min_length=1, description="where skills resolve (relative to the home)")
    skill_prompt_kb: int = Field(
        32, ge=0, le=1024, description="KiB of SKILL.md bodies appended to an agent's instructions; skills past it are "
        "listed and read with skill-read"
    )
    python: str | None = Field(None, description="interpreter for replicas (default: the daemon's own)")
    memory_small_mb: int = Field(256, gt=0, le=1024 * 1024, description="memory of a resource_profile small agent: its replica's RLIMIT_AS, its tool runs' resident memory")
    memory_medium_mb: int = Field(1024, gt=0, le=1024 * 1024, description="memory of a resource_profile medium agent: its replica's RLIMIT_AS, its tool runs' resident memory")
    memory_large_mb: int = Field(4096, gt=0, le=1024 * 1024, description="memory of a resource_profile large agent: its replica's RLIMIT_AS, its tool runs' resident memory")
    nice_small: int = Field(10, ge=-20, le=19, description="nice of the processes of a resource_profile small agent")
    nice_medium: int = Field(5, ge=-20, le=19, description="nice of the processes of a resource_profile medium agent")
    nice_large: int = Field(0, ge=-20, le=19, description="nice of the processes of a resource_profile large agent")
    cpu_small: float = Field(0.5, gt=0, le=1024, description="CPU cores a resource_profile small agent's processes share")
    cpu_medium: float = Field(1.0, gt=0, le=1024, description="CPU cores a resource_profile medium agent's processes share")
    cpu_large: float = Field(2.0, gt=0, le=1024, description="CPU cores a resource_profile large agent's processes share")
    max_depth: int = Field(10, ge=1, le=100, description="deepest chain of agent calls (A2A and workflow steps) when a tool sets no max_depth")
    spawned_ttl_s: int = Field(600, ge=1, le=7 * 86_400, description="how long an agent made by rune@agent-spawn lives")
    spawned_max: int = Field(4, ge=0, le=100, description="live spawned agents per spawning agent and issuer; 0 = none")
    unavailable_tools: Literal["warn", "refuse"] = Field(
        "warn", description="an unavailable toolset entry: a warning (the agent loads), or a load error"
    )
    suspicious: Literal["warn", "refuse"] = Field(
        "warn", description="loading a session whose turns look like prompt injection: a warning, or refused "
        "(outcome session_suspicious)"
    )
    mcp_header_env: tuple[Annotated[str, AfterValidator(lambda v: _env_name(v))], ...] = Field(
        (), description="daemon env vars a Runefile's MCP header values may name as ${VAR}"
    )

    def memory_mb(self, profile: str) -> int:
        return {"small": self.memory_small_mb, "medium": self.memory_medium_mb, "large": self.memory_large_mb}[profile]

    def nice(self, profile: str) -> int:
        """The nice of a ``resource_profile``, before a dispatch's priority moves it (``[rune] nice_*``)."""
        return {"small": self.nice_small, "medium": self.nice_medium, "large": self.nice_large}[profile]

    def cpu_cores(self, profile: str) -> float:
        """The CPU cores all processes of an agent of a ``resource_profile`` may use together (``[rune] cpu_*``)."""
        return {"small": self.cpu_small, "medium": self.cpu_medium, "large": self.cpu_large}[profile]


class FilesToolConfig(_Section):
    """``[tools.files]``: rune@file-read, file-write, file-list, apply-patch (docs/tools.md)."""

    read_max_bytes: int = Field(32768, gt=0, le=60 * 1024, description="most bytes one file-read returns")
    write_max_bytes: int = Field(262144, gt=0, le=1 << 30, description="largest file file-write or apply-patch writes")
    list_max_entries: int = Field(1000, gt=0, le=100_000, description="most entries one file-list returns")


class ShellExecToolConfig(_Section):
    """``[tools.shell_exec]``: rune@shell-exec (docs/tools.md)."""

    timeout_ms: int = Field(10_000, gt=0, le=3_600_000, description="default and largest timeout of one command")
    output_max_bytes: int = Field(16384, gt=0, le=30 * 1024, description="most bytes of stdout, and of stderr, returned")


def _allow_entries(value: tuple[str, ...]) -> tuple[str, ...]:
    from covenant.netpolicy import parse_allow_entry

    for entry in value:
        parse_allow_entry(entry)
    return value


class WebFetchToolConfig(_Section):
    """``[tools.web_fetch]``: rune@web-fetch (docs/tools.md)."""

    timeout_ms: int = Field(10_000, gt=0, le=600_000, description="one fetch, redirects included")
    max_bytes: int = Field(32768, gt=0, le=60 * 1024, description="most body bytes returned; the rest is not read")
    max_redirects: int = Field(5, ge=0, le=20, description="redirects followed, each target checked again")
    allow: Annotated[tuple[str, ...], AfterValidator(_allow_entries)] = Field(
        (), description="hosts and CIDRs allowed although loopback, private or special"
    )


AgentNetwork = Literal["off", "full", "outbound-https-only"]


class ShellToolConfig(_Section):
    """``[tools.shell]``: what the commands of rune@shell-exec and rune@process-* may reach (docs/tools.md)."""

    network: AgentNetwork = Field(
        "off", description='their network: "off" (their own loopback only), "outbound-https-only" or "full"'
    )


class ProcessToolConfig(_Section):
    """``[tools.process]``: rune@process-start|poll|write|kill|list (docs/tools.md)."""

    max_per_agent: int = Field(8, gt=0, le=1000, description="supervised processes one agent may have at once")
    output_max_bytes: int = Field(16384, gt=0, le=30 * 1024, description="most bytes of stdout, and of stderr, one poll returns")


_PROVIDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _base_url(value: str) -> str:
    if not re.match(r"^https?://[^/\s?#]+(/[^\s?#]*)?$", value):
        raise ValueError(f"{value!r} must be an http:// or https:// URL with no query or fragment")
    return value.rstrip("/")


_ADAPTER_ID = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")


def _adapter_table(value: Any) -> Any:
    """``adapters = { "<adapter id>" = "<model or LoRA name>" }`` as sorted (id, name) pairs."""
    if not isinstance(value, dict):
        return value  # a tuple given in code; anything else fails the type check with its own message
    for adapter_id, name in value.items():
        if not _ADAPTER_ID.match(adapter_id):
            raise ValueError(f"adapter id {adapter_id!r}: use 1-128 of A-Za-z0-9 . _ : / -")
        if not isinstance(name, str) or not 0 < len(name) <= 256:
            raise ValueError(f"adapters.{adapter_id} must be a model or LoRA name (1-256 characters)")
    return tuple(sorted(value.items()))


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        # The value is not repeated: what was pasted here by mistake may be the key itself.
        raise ValueError("must be the name of an environment variable (letters, digits, _), not the key itself")
    return value


def _provider_names(value: dict[str, ProviderConfig]) -> dict[str, ProviderConfig]:
    for name in value:
        if not _PROVIDER_NAME.match(name):
            raise ValueError(f"[providers.{name}]: a provider name is 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit")
    return value


class ProviderConfig(_Section):
    """``[providers.NAME]``: one model provider the daemon's gateway may call (docs/providers.md)."""

    kind: Literal["openai", "anthropic"] = Field(description="wire format: OpenAI chat completions or Anthropic messages")
    base_url: Annotated[str, AfterValidator(_base_url)] = Field(description="e.g. https://api.openai.com/v1")
    api_key_env: Annotated[str, AfterValidator(_env_name)] | None = Field(
        None, description="name of the daemon's env var holding the key; unset for local servers"
    )
    model: str | None = Field(
        None, min_length=1, description="always ask this provider for this model id (a local server with one model)"
    )
    timeout_s: float = Field(120, gt=0, le=3600, description="one request, connect to last byte")
    max_output_tokens: int | None = Field(
        None, gt=0, le=1_000_000, description="sent as max_tokens; unset: not sent (openai), 4096 (anthropic)"
    )
    anthropic_version: str = Field(
        "2023-06-01", pattern=r"^[0-9A-Za-z._-]{1,64}$", description="anthropic-version header (kind anthropic)"
    )
    max_connections: int = Field(100, gt=0, le=10_000, description="open connections to this provider at most")
    adapters: Annotated[tuple[tuple[str, str], ...], BeforeValidator(_adapter_table)] | None = Field(
        None,
        description="a table: adapter id -> the model or LoRA name this provider serves it as (the test-driven loop's "
        "adapter_ids); kept as sorted pairs so the provider's settings stay hashable; unset: none",
    )
    adapter_field: Literal["model", "lora"] = Field(
        "model", description="how an adapter is asked for: as the request's model (vLLM) or a lora field beside it"
    )


class WebSearchToolConfig(_Section):
    """``[tools.web_search]``: rune@web-search (docs/tools.md)."""

    url: Annotated[str, AfterValidator(_base_url)] | None = Field(
        None, description="a SearXNG-compatible JSON endpoint; the daemon asks it ?q=…&format=json"
    )
    timeout_s: float = Field(4, gt=0, le=120, description="one search request (the call is also cut at timeout_ms)")
    max_results: int = Field(10, gt=0, le=50, description="results given to the model at most")


class LocationToolConfig(_Section):
    """``[tools.location]``: what rune@location-get answers, as the operator wrote it (never looked up or guessed)."""

    latitude: float | None = Field(None, ge=-90, le=90, description="decimal degrees, north positive (with longitude)")
    longitude: float | None = Field(None, ge=-180, le=180, description="decimal degrees, east positive (with latitude)")
    city: str | None = Field(None, min_length=1, max_length=200, description="the host's city, as it should be named")
    country: str | None = Field(None, min_length=1, max_length=200, description="the host's country")
    timezone: str | None = Field(None, min_length=1, max_length=64, description='an IANA time zone, e.g. "Europe/Berlin"')

    @model_validator(mode="after")
    def _coherent(self) -> "LocationToolConfig":
        if (self.latitude is None) != (self.longitude is None):
            raise ValueError("[tools.location]: set latitude and longitude together (or neither)")
        if self.timezone is not None:
            from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # loaded only when a timezone is set

            try:
                ZoneInfo(self.timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"[tools.location] timezone {self.timezone!r} is not an IANA time zone "
                                 "known to this host (e.g. \"Europe/Berlin\", \"UTC\")") from None
        return self

    def configured(self) -> dict[str, Any]:
        """The fields the operator set; empty when the section is absent."""
        return {key: value for key, value in self.model_dump().items() if value is not None}


class WasmToolConfig(_Section):
    """``[tools.wasm]``: ``runtime: wasm`` tools, run through wasmtime in the agent's sandbox (docs/tools.md)."""

    fuel_per_ms: int = Field(
        100_000, gt=0, le=1_000_000_000,
        description="wasmtime fuel (about one WebAssembly instruction each) a call gets per ms of the tool's timeout_ms",
    )
    output_max_bytes: int = Field(
        1024 * 1024, gt=0, le=64 * 1024 * 1024,
        description="the output buffer a run(input_ptr, input_len, output_ptr, output_max) module may fill",
    )


_IMAGE_REFERENCE = re.compile(r"^([A-Za-z0-9.-]+:[0-9]{1,5}/)?[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@sha256:[0-9a-f]{64})?$")


def _image_references(value: tuple[str, ...]) -> tuple[str, ...]:
    for image in value:
        if len(image) > 255 or not _IMAGE_REFERENCE.match(image):
            raise ValueError(f"{image!r} is not an image reference (e.g. \"localhost/tools:1\", "
                             "\"docker.io/library/alpine:3.19\", or one pinned with @sha256:<digest>)")
    return value


class ContainerToolConfig(_Section):
    """``[tools.container]``: ``runtime: container`` tools and rune@docker-exec, run by rootful podman (docs/tools.md)."""

    images: Annotated[tuple[str, ...], AfterValidator(_image_references)] = Field(
        (), description="the only images a container tool or docker-exec may run (never pulled: build or load them)"
    )
    podman: str = Field("podman", min_length=1, description="the podman program (absolute, or found on the system PATH)")
    runc: str = Field("runc", min_length=1, description="the OCI runtime podman is told to use (absolute, or found on the system PATH)")
    pids_max: int = Field(256, gt=0, le=65536, description="processes and threads one container may have")
    timeout_ms: int = Field(30_000, gt=0, le=3_600_000, description="default and largest timeout of one docker-exec command")
    output_max_bytes: int = Field(16384, gt=0, le=30 * 1024, description="most bytes of stdout, and of stderr, docker-exec returns")
    network: AgentNetwork = Field(
        "off", description='the network of docker-exec commands: "off" (their own loopback only), "outbound-https-only" or "full"'
    )


class MediaToolConfig(_Section):
    """``[tools.media]``: the media tools, run as the agent in its workspace (docs/tools.md, "Media tools")."""

    input_max_bytes: int = Field(
        64 * 1024 * 1024, gt=0, le=4 << 30, description="largest workspace file a media tool reads (transcribe, describe, analyze)"
    )
    output_max_bytes: int = Field(
        32 * 1024 * 1024, gt=0, le=4 << 30, description="largest file text-to-speech or image-generate writes"
    )
    text_max_chars: int = Field(5000, gt=0, le=1_000_000, description="most characters text-to-speech speaks in one call")
    audio_max_s: int = Field(600, gt=0, le=86_400, description="seconds of audio transcribed at most; the rest is left out")
    timeout_ms: int = Field(60_000, gt=0, le=3_600_000, description="one media tool call, never past the intent's deadline")
    espeak: str = Field("espeak-ng", min_length=1, description="text-to-speech's program, looked up on [runtime] path")
    ffmpeg: str = Field("ffmpeg", min_length=1, description="the decoder of speech-to-text and media-transcribe")
    ffprobe: str = Field("ffprobe", min_length=1, description="media-describe's prober")
    image_max_bytes: int = Field(
        5 * 1024 * 1024, gt=0, le=64 * 1024 * 1024, description="largest image image-analyze sends to the model"
    )
    images_provider: str | None = Field(
        None, min_length=1, description="the openai-kind [providers.NAME] whose images endpoint image-generate calls; unset: "
        "image-generate is unavailable"
    )
    images_model: str | None = Field(None, min_length=1, description="the model image-generate asks for (default: the "
                                     "provider's model)")


class BrowserToolConfig(_Section):
    """``[tools.browser]``: rune@browser-*, one headless Chromium per agent session, run as the agent
    (docs/tools.md, "Browser tools")."""

    chromium: str = Field("chromium", min_length=1, description="the browser's program, looked up on [runtime] path")
    network: Literal["full", "outbound-https-only"] = Field(
        "outbound-https-only", description="the network namespace the browser runs in (never the host's)"
    )
    allow: Annotated[tuple[str, ...], AfterValidator(_allow_entries)] = Field(
        (), description="hosts and CIDRs the browser may load although loopback, private or special"
    )
    memory_mb: int = Field(1024, ge=256, le=65_536, description="the browser's memory: RLIMIT_DATA of each Chromium "
                           "process and the resident size of the whole browser")
    idle_s: int = Field(300, gt=0, le=86_400, description="a browser with no call for this long is closed")
    lifetime_s: int = Field(3600, gt=0, le=86_400, description="a browser is closed after this long whatever its use "
                            "(its CPU time is bounded by it too); the next call starts a fresh one")
    max_per_agent: int = Field(2, gt=0, le=64, description="browsers one agent may have open at once")
    timeout_ms: int = Field(30_000, gt=0, le=600_000, description="one browser tool call, starting the browser "
                            "included, never past the intent's deadline")
    text_max_chars: int = Field(60_000, gt=0, le=65_536, description="most characters read-page and run-js return "
                                "(kept under the 64 KiB result cap, which cuts them further)")
    screenshot_max_kb: int = Field(700, gt=0, le=700, description="largest screenshot PNG, KiB (it crosses the "
                                   "runner's 1 MiB stdout as base64)")


class ArtifactsToolConfig(_Section):
    """``[tools.artifacts]``: the files an intent's tools hand back (rune@canvas-present),
    kept under ``state/artifacts/<intent>/`` (docs/tools.md)."""

    max_files: int = Field(32, gt=0, le=10_000, description="artifacts one intent may make")
    max_file_kb: int = Field(8192, gt=0, le=1024 * 1024, description="largest artifact, KiB")
    max_intent_kb: int = Field(32768, gt=0, le=16 * 1024 * 1024, description="all of one intent's artifacts together, KiB")


class ToolsConfig(_Section):
    """``[tools.*]``: the built-in tools' settings and limits."""

    max_runs_per_agent: int = Field(
        16, gt=0, le=1000, description="process tool and rune@shell-exec runs one agent may have at once; more wait"
    )
    tool_network: Literal["full", "outbound-https-only"] = Field(
        "outbound-https-only",
        description="the network of a process tool that declares the network capability (one without it gets none)",
    )
    files: FilesToolConfig = Field(default_factory=FilesToolConfig)
    shell: ShellToolConfig = Field(default_factory=ShellToolConfig)
    shell_exec: ShellExecToolConfig = Field(default_factory=ShellExecToolConfig)
    web_fetch: WebFetchToolConfig = Field(default_factory=WebFetchToolConfig)
    process: ProcessToolConfig = Field(default_factory=ProcessToolConfig)
    web_search: WebSearchToolConfig = Field(default_factory=WebSearchToolConfig)
    location: LocationToolConfig = Field(default_factory=LocationToolConfig)
    wasm: WasmToolConfig = Field(default_factory=WasmToolConfig)
    artifacts: ArtifactsToolConfig = Field(default_factory=ArtifactsToolConfig)
    container: ContainerToolConfig = Field(default_factory=ContainerToolConfig)
    media: MediaToolConfig = Field(default_factory=MediaToolConfig)
    browser: BrowserToolConfig = Field(default_factory=BrowserToolConfig)


class ChannelConfig(_Section):
    """``[channels.NAME]``: a webhook channel of rune@channel-send (docs/tools.md)."""

    url_env: Annotated[str, AfterValidator(_env_name)] = Field(description="env var holding the webhook URL")
    secret_env: Annotated[str, AfterValidator(_env_name)] = Field(description="env var holding the HMAC-SHA256 key")
    timeout_s: float = Field(4, gt=0, le=120, description="one delivery (the call is also cut at timeout_ms)")


def _channel_names(value: dict[str, ChannelConfig]) -> dict[str, ChannelConfig]:
    for name in value:
        if not _MCP_NAME.match(name):
            raise ValueError(f"[channels.{name}]: a channel name is 1-63 lowercase letters, digits, '_' or '-'")
    return value


_MCP_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class McpServerConfig(_Section):
    """``[mcp.NAME]``: a stdio MCP server, started as the agent's uid for each agent that lists its tools."""

    command: tuple[str, ...] = Field(min_length=1, description="argv; the program is looked up on [runtime] path")
    env: dict[str, str] = Field(default_factory=dict, description="variables added to the server's environment")
    cwd: str | None = Field(None, min_length=1, description="working directory (default: the agent's package folder)")
    network: AgentNetwork = Field(
        "off", description='its network: "off" (its own loopback only), "outbound-https-only" or "full"'
    )

    @model_validator(mode="after")
    def _check(self) -> "McpServerConfig":
        if not self.command[0]:
            raise ValueError("command: the program (its first element) must not be empty")
        for name in self.env:
            _env_name(name)
        if self.cwd is not None and not os.path.isabs(self.cwd):
            raise ValueError(f"cwd {self.cwd!r} must be an absolute path")
        return self

    def named_paths(self) -> list[str]:
        """Absolute paths its arguments name (``/p`` or ``--opt=/p``) and its cwd: a private /tmp of the
        agent's uid keeps the ones under /tmp visible to the server."""
        values = [arg.partition("=")[2] if arg.startswith("-") else arg for arg in self.command[1:]]
        return [v for v in [*values, self.cwd or ""] if os.path.isabs(v)]


def _mcp_names(value: dict[str, McpServerConfig]) -> dict[str, McpServerConfig]:
    for name in value:
        if not _MCP_NAME.match(name):
            raise ValueError(f"[mcp.{name}]: an MCP server name is 1-63 lowercase letters, digits, '_' or '-'")
    return value


def _unique_schedules(value: tuple[ScheduleConfig, ...]) -> tuple[ScheduleConfig, ...]:
    names = [s.name for s in value]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"schedule names must be unique; used more than once: {', '.join(twice)}")
    return value


class Config(_Section):
    """Top level of covenant.toml."""

    # Validated here so a wrong type is reported with the rest; resolved to paths by
    # covenant.home.Home (which the pydantic-free `covenant dispatch` path also uses).
    agents_dir: str = Field("agents", min_length=1)
    socket: str = Field("run/covenant.sock", min_length=1)
    default_agent: str | None = None
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    rune: RuneConfig = Field(default_factory=RuneConfig)
    providers: Annotated[dict[str, ProviderConfig], AfterValidator(_provider_names)] = Field(default_factory=dict)
    isolation: IsolationConfig = Field(default_factory=IsolationConfig)
    mcp: Annotated[dict[str, McpServerConfig], AfterValidator(_mcp_names)] = Field(default_factory=dict)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    channels: Annotated[dict[str, ChannelConfig], AfterValidator(_channel_names)] = Field(default_factory=dict)
    webhooks: WebhooksConfig = Field(default_factory=WebhooksConfig)
    a2a: A2AConfig = Field(default_factory=A2AConfig)
    fleet: FleetConfig = Field(default_factory=FleetConfig)
    schedules: Annotated[tuple[ScheduleConfig, ...], AfterValidator(_unique_schedules)] = Field(
        default_factory=tuple, description="[[schedules]]: intents fired on a period or cron (docs/triggers.md)")


def load_config(home: Home) -> Config:
    """Load and validate ``<home>/covenant.toml``.

    Each problem names the file, the line, the key and what to write instead
    (for an unknown key: the accepted keys of its table), in covenant's words.
    """
    raw = home.raw_config()
    try:
        # Strict, through JSON: TOML values keep their types, so "5" is not an integer and "yes" is not
        # a boolean (a lax coercion would hide a mistake); JSON mode still reads arrays as tuples.
        return Config.model_validate_json(json.dumps(raw, default=str), strict=True)
    except ValidationError as exc:
        try:
            text = home.config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        problems = sorted((_problem(home, text, err) for err in exc.errors()), key=_line_of)
        raise ConfigError(
            "\n".join(text for _, text in problems) + "\n(docs/configuration.md lists every key; fix the file and start again)",
            path=str(home.config_path),
        ) from None


_BOUNDS = {"gt": "greater than", "ge": "at least", "lt": "less than", "le": "at most"}


def _describe(err: Any, model: type[BaseModel]) -> str:
    """What is wrong with one value, and what to write instead, without pydantic's wording."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err["input"]
    got = f"got {value!r}"
    if kind == "extra_forbidden":
        import difflib  # here: only a configuration with an unknown key needs it, not a running daemon

        accepted = list(model.model_fields)
        close = difflib.get_close_matches(str(err["loc"][-1]), accepted, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"unknown key ({hint}accepted keys here: {', '.join(accepted)})"
    if kind in ("model_type", "dict_type"):
        return f"must be a table, {got}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"must be an integer (written without quotes), {got}"
    if kind in ("float_parsing", "float_type"):
        return f"must be a number (written without quotes), {got}"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false (without quotes), {got}"
    if kind == "string_type":
        return f"must be a string in quotes, {got}"
    if kind in ("tuple_type", "list_type"):
        return f"must be an array, [ … ], {got}"
    if kind == "missing":
        return "is required in this table"
    if kind == "value_error":
        return str(ctx.get("error") or err["msg"].removeprefix("Value error, "))
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, {got}"
    if kind in ("string_too_short", "too_short"):
        return "must not be empty"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        bound = next(k for k in _BOUNDS if k in ctx)
        limit = ctx[bound]
        limit = int(limit) if isinstance(limit, float) and limit.is_integer() else limit
        return f"must be {_BOUNDS[bound]} {limit}, {got}"
    return f"is not valid ({err['msg'].lower()}), {got}"


def _line_of(problem: tuple[int | None, str]) -> int:
    return problem[0] or 0


def _table_model(name: str) -> type[BaseModel] | None:
    """The model of top-level table ``name`` (``runtime``, ``providers``…), None for a plain key."""
    field = Config.model_fields.get(name)
    annotation = field.annotation if field is not None else None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return {"providers": ProviderConfig, "mcp": McpServerConfig, "channels": ChannelConfig}.get(name)


def _problem(home: Home, text: str, err: Any) -> tuple[int | None, str]:
    """(line, ``path:line: [table] key: what is wrong``)."""

    loc = [str(part) for part in err["loc"]]
    model = _table_model(loc[0])
    if model is None:  # a top-level key
        table, keys, model = None, loc, Config
    elif loc[0] in ("providers", "mcp", "channels") and len(loc) > 1:  # [providers.NAME] / [mcp.NAME] key
        table, keys = f"{loc[0]}.{loc[1]}", loc[2:]
    else:
        table, keys = loc[0], loc[1:]
    key = keys[0] if keys else None
    line = None
    if text:  # a whole table (`[isolation]` failing its own check, or `runtime = 5`): its header or its key
        line = key_line(text, table, key) if key or table is None else (
            key_line(text, table, None) or key_line(text, None, table))
    where = f"{home.config_path}:{line}" if line else str(home.config_path)
    field = " ".join(part for part in (f"[{table}]" if table else "", ".".join(keys)) if part)
    return line, f"{where}: {field}: {_describe(err, model)}"
