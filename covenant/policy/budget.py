"""Settlement: a rolling one-hour budget per agent, in CPU milliseconds actually used.

``budget_credits_per_hour = N`` (N > 0) lets an agent spend N CPU-ms in any
trailing hour; 0 means unlimited. A dispatch is checked before it starts and
charged when it ends, so dispatches already running when the budget runs out
may overshoot it by what they use; the next check after them refuses.

Pure and in memory. State is bounded: charges are summed into one-second
buckets (at most 3600 per agent) and buckets older than the hour are dropped.
A charge is filed under the *end* of its second, so it expires up to a
second late, never early (the budget is never freed before it should be).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from covenant.manifest.model import AgentSpec
from covenant.clock import iso_ms
from covenant.policy.errors import BudgetExhausted

__all__ = ["BudgetLedger", "WINDOW_MS"]

WINDOW_MS = 3_600_000
BUCKET_MS = 1000


class BudgetLedger:
    """CPU-ms spent per agent over the trailing hour."""

    def __init__(self) -> None:
        # agent id -> parallel sorted lists: bucket times (ms) and CPU-ms charged in that bucket
        self._times: dict[str, list[int]] = {}
        self._spent: dict[str, list[int]] = {}

    @classmethod
    def from_records(cls, records: Iterable[tuple[str, int, int]], now_ms: int) -> "BudgetLedger":
        """Rebuild from past dispatches ``(agent_id, cpu_ms, ended_at_ms)`` so a restart keeps budgets."""
        ledger = cls()
        for agent_id, cpu_ms, ended_at_ms in records:
            if ended_at_ms + WINDOW_MS > now_ms:
                ledger.charge(agent_id, cpu_ms, ended_at_ms)
        ledger.prune(now_ms)
        return ledger

    def charge(self, agent_id: str, cpu_ms: int, at_ms: int) -> None:
        """Record ``cpu_ms`` used by one dispatch of ``agent_id`` that ended at ``at_ms``."""
        if cpu_ms < 0:
            raise ValueError("cpu_ms must not be negative")
        if cpu_ms == 0:
            return
        bucket = -(-at_ms // BUCKET_MS) * BUCKET_MS  # round up: expire late, never early
        times = self._times.setdefault(agent_id, [])
        spent = self._spent.setdefault(agent_id, [])
        i = bisect.bisect_left(times, bucket)
        if i < len(times) and times[i] == bucket:
            spent[i] += cpu_ms
        else:
            times.insert(i, bucket)
            spent.insert(i, cpu_ms)
        self._prune_agent(agent_id, at_ms)

    def spent(self, agent_id: str, now_ms: int) -> int:
        """CPU-ms charged to ``agent_id`` within the hour before ``now_ms``."""
        self._prune_agent(agent_id, now_ms)
        return sum(self._spent.get(agent_id, ()))

    def check(self, agent: AgentSpec, now_ms: int) -> None:
        """Raise BudgetExhausted (with ``frees_at``) when the agent spent its hourly budget."""
        budget = agent.settlement.budget_credits_per_hour
        if budget == 0:
            return
        spent = self.spent(agent.id, now_ms)
        if spent < budget:
            return
        frees_at_ms = self._frees_at(agent.id, spent, budget)
        raise BudgetExhausted(
            f"agent {agent.id} used {spent} of its {budget} CPU-ms budget for the last hour; "
            f"it can run again at {iso_ms(frees_at_ms)} (or raise [settlement] budget_credits_per_hour "
            f"in {agent.manifest_path})",
            agent=agent.id,
            budget=budget,
            spent=spent,
            frees_at_ms=frees_at_ms,
            frees_at=iso_ms(frees_at_ms),
        )

    def prune(self, now_ms: int) -> None:
        """Drop every charge older than the hour (and agents left with none)."""
        for agent_id in list(self._times):
            self._prune_agent(agent_id, now_ms)

    def __len__(self) -> int:
        """Number of buckets held (the state this ledger keeps)."""
        return sum(len(t) for t in self._times.values())

    def _frees_at(self, agent_id: str, spent: int, budget: int) -> int:
        # Oldest buckets leave the window first; find the one whose departure
        # brings the total under the budget.
        times = self._times[agent_id]
        remaining = spent
        for bucket, cpu_ms in zip(times, self._spent[agent_id]):
            remaining -= cpu_ms
            if remaining < budget:
                return bucket + WINDOW_MS
        return times[-1] + WINDOW_MS  # budget > 0, so the loop returns by the last bucket

    def _prune_agent(self, agent_id: str, now_ms: int) -> None:
        times = self._times.get(agent_id)
        if times is None:
            return
        cut = bisect.bisect_right(times, now_ms - WINDOW_MS)  # buckets at or before now-1h have expired
        if cut:
            del times[:cut]
            del self._spent[agent_id][:cut]
        if not times:
            del self._times[agent_id]
            del self._spent[agent_id]
