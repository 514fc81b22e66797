"""The fleet's streams, consumers and bucket, created idempotently by whichever fleet process needs them first.

An existing stream or consumer is used as it is; when its settings differ from
this host's ``[fleet]`` (another host made it with other ``replicas``,
``ack_wait_s`` or ``max_deliver``) that is logged once, with what to do, and the
values in NATS are the ones that count. Names: :mod:`covenant.fleet.subjects`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from covenant.fleet.config import FleetConfig
from covenant.fleet.subjects import (
    AUDIT_STREAM,
    AUDIT_SUBJECTS,
    HOSTS_BUCKET,
    INTENT_SUBJECTS,
    INTENTS_STREAM,
    RESULT_SUBJECTS,
    RESULTS_STREAM,
    consumer_name,
    intent_subject,
)

if TYPE_CHECKING:
    from nats.js.api import ConsumerInfo, StreamConfig
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

__all__ = ["HOST_TTL_S", "DUPLICATE_WINDOW_S", "ensure_streams", "ensure_hosts_bucket", "ensure_consumer"]

log = logging.getLogger("covenant.fleet")

HOST_TTL_S = 15
"""A host entry not rewritten for this long is gone: the host is not live."""
DUPLICATE_WINDOW_S = 120
_RESULT_AGE_S = 24 * 3600
_AUDIT_AGE_S = 30 * 24 * 3600
_STREAM_IN_USE = 10058  # JetStream: "stream name already in use with a different configuration"
_CONSUMER_EXISTS = 10148  # "consumer already exists" (another host made it with other settings, just now)


def _stream_configs(config: FleetConfig) -> "list[StreamConfig]":
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

    return [
        StreamConfig(name=INTENTS_STREAM, subjects=[INTENT_SUBJECTS], retention=RetentionPolicy.WORK_QUEUE,
                     storage=StorageType.FILE, num_replicas=config.replicas, duplicate_window=DUPLICATE_WINDOW_S),
        # One answer per intent, the first one: a later publish on the same subject is refused by the stream.
        StreamConfig(name=RESULTS_STREAM, subjects=[RESULT_SUBJECTS], retention=RetentionPolicy.LIMITS,
                     storage=StorageType.FILE, num_replicas=config.replicas, max_age=_RESULT_AGE_S,
                     max_msgs_per_subject=1, discard=DiscardPolicy.NEW, discard_new_per_subject=True,
                     duplicate_window=DUPLICATE_WINDOW_S),
        StreamConfig(name=AUDIT_STREAM, subjects=[AUDIT_SUBJECTS], retention=RetentionPolicy.LIMITS,
                     storage=StorageType.FILE, num_replicas=config.replicas, max_age=_AUDIT_AGE_S,
                     duplicate_window=DUPLICATE_WINDOW_S),
    ]


async def ensure_streams(js: "JetStreamContext", config: FleetConfig) -> None:
    """COVENANT_INTENTS, COVENANT_RESULTS and COVENANT_AUDIT exist (made here when they did not)."""
    from nats.js.errors import APIError, NotFoundError

    for wanted in _stream_configs(config):
        assert wanted.name is not None
        try:
            info = await js.stream_info(wanted.name)
        except NotFoundError:
            try:
                info = await js.add_stream(wanted)
                log.info("stream created", extra={"stream": wanted.name, "replicas": wanted.num_replicas})
                continue
            except APIError as exc:
                if exc.err_code != _STREAM_IN_USE:
                    raise
                info = await js.stream_info(wanted.name)  # another host made it a moment ago
        if info.config.num_replicas != wanted.num_replicas:
            log.warning("stream exists with other replicas than [fleet] replicas; it is used as it is",
                        extra={"stream": wanted.name, "replicas": info.config.num_replicas,
                               "configured": wanted.num_replicas})


async def ensure_hosts_bucket(js: "JetStreamContext", config: FleetConfig) -> "KeyValue":
    """The COVENANT_HOSTS bucket (entries live HOST_TTL_S), made here when it did not exist."""
    from nats.js.errors import APIError, BucketNotFoundError

    try:
        return await js.key_value(HOSTS_BUCKET)
    except BucketNotFoundError:
        pass
    try:
        return await js.create_key_value(bucket=HOSTS_BUCKET, ttl=HOST_TTL_S, history=1, replicas=config.replicas)
    except APIError as exc:
        if exc.err_code != _STREAM_IN_USE:
            raise
        return await js.key_value(HOSTS_BUCKET)


async def ensure_consumer(js: "JetStreamContext", agent_id: str, config: FleetConfig) -> "ConsumerInfo":
    """The durable pull consumer every host running ``agent_id`` shares; its info (ack_wait, max_deliver) counts."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import APIError, NotFoundError

    name = consumer_name(agent_id)
    try:
        info = await js.consumer_info(INTENTS_STREAM, name)
    except NotFoundError:
        wanted = ConsumerConfig(name=name, durable_name=name, filter_subject=intent_subject(agent_id),
                                ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                                ack_wait=config.ack_wait_s, max_deliver=config.max_deliver,
                                max_ack_pending=-1, description=f"covenant agent {agent_id}")
        try:
            info = await js.add_consumer(INTENTS_STREAM, wanted)
            log.info("consumer created", extra={"consumer": name, "agent": agent_id})
            return info
        except APIError as exc:
            if exc.err_code != _CONSUMER_EXISTS:
                raise
            info = await js.consumer_info(INTENTS_STREAM, name)
    if info.config.ack_wait != config.ack_wait_s or info.config.max_deliver != config.max_deliver:
        log.warning("consumer exists with other settings than [fleet] ack_wait_s / max_deliver; its own count",
                    extra={"consumer": name, "ack_wait_s": info.config.ack_wait, "max_deliver": info.config.max_deliver,
                           "configured_ack_wait_s": config.ack_wait_s, "configured_max_deliver": config.max_deliver})
    return info
