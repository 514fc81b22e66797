"""The daemon side of model calls: provider adapters, the gateway, budgets (docs/providers.md)."""

from covenant.models.gateway import MODEL_CALL, RETRY_AFTER_MAX_S, ModelGateway, TokenCallback
from covenant.models.plan import ModelPlan, PlannedProvider, SkippedProvider
from covenant.models.types import (
    AgentModels,
    AuditSink,
    CallObserver,
    ChatResult,
    ModelCall,
    ModelError,
    ModelErrorCode,
    TokenBudget,
)

__all__ = [
    "ModelGateway",
    "MODEL_CALL",
    "RETRY_AFTER_MAX_S",
    "TokenCallback",
    "ModelPlan",
    "PlannedProvider",
    "SkippedProvider",
    "AgentModels",
    "AuditSink",
    "CallObserver",
    "ChatResult",
    "ModelCall",
    "ModelError",
    "ModelErrorCode",
    "TokenBudget",
]
