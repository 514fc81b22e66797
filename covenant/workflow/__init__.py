"""Across agents: child intents (A2A calls, workflow steps) and the workflow DAG engine.

The daemon owns all of it: :mod:`covenant.workflow.chain` remembers which
intent made which, how deep each is and until when it may run;
:mod:`covenant.workflow.child` builds and signs child intents on the root
issuer's behalf; :mod:`covenant.workflow.engine` runs a ``workflow.yaml``
whose steps are child intents; :mod:`covenant.workflow.preflight` checks
every step before the first one runs; :mod:`covenant.workflow.plan` is what
``dispatch --dry-run`` shows of it.
"""

from covenant.workflow.chain import ChainLink, IntentChain
from covenant.workflow.child import ChildCall, ChildRefused, agent_from_ref, build_child_intent

__all__ = ["ChainLink", "IntentChain", "ChildCall", "ChildRefused", "agent_from_ref", "build_child_intent"]
