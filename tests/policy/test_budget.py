"""Rolling one-hour budgets in CPU-ms: exhausted with frees_at, freed after the hour, 0 = unlimited."""

from __future__ import annotations

import pytest

from covenant.policy.budget import WINDOW_MS, BudgetLedger
from covenant.policy.errors import BudgetExhausted

from .conftest import NOW, make_agent

T0 = NOW - NOW % 1000  # on a second boundary, so bucket rounding is exact in these tests


def test_unlimited_budget_never_refuses() -> None:
    ledger = BudgetLedger()
    agent = make_agent(budget=0)
    ledger.charge(agent.id, 10**9, T0)
    ledger.check(agent, T0)


def test_budget_exhausted_then_freed_after_the_hour() -> None:
    ledger = BudgetLedger()
    agent = make_agent(budget=1000)
    ledger.charge(agent.id, 600, T0)
    ledger.check(agent, T0 + 1)
    ledger.charge(agent.id, 500, T0 + 60_000)
    with pytest.raises(BudgetExhausted) as err:
        ledger.check(agent, T0 + 120_000)
    exc = err.value
    assert exc.code == "budget_exhausted" and exc.http_status == 429 and exc.exit_code == 3
    # dropping the first charge (600) brings 1100 under 1000: frees when it leaves the window
    assert exc.details["frees_at_ms"] == T0 + WINDOW_MS
    assert exc.details["frees_at"].endswith("Z") and exc.details["spent"] == 1100
    assert agent.id in exc.message and exc.details["frees_at"] in exc.message
    with pytest.raises(BudgetExhausted):
        ledger.check(agent, T0 + WINDOW_MS - 1)
    ledger.check(agent, T0 + WINDOW_MS)  # freed
    assert ledger.spent(agent.id, T0 + WINDOW_MS) == 500


def test_frees_at_skips_charges_that_do_not_bring_it_under() -> None:
    ledger = BudgetLedger()
    agent = make_agent(budget=100)
    ledger.charge(agent.id, 10, T0)
    ledger.charge(agent.id, 500, T0 + 5000)
    with pytest.raises(BudgetExhausted) as err:
        ledger.check(agent, T0 + 6000)
    assert err.value.details["frees_at_ms"] == T0 + 5000 + WINDOW_MS


def test_exactly_at_budget_is_exhausted() -> None:
    ledger = BudgetLedger()
    agent = make_agent(budget=100)
    ledger.charge(agent.id, 99, T0)
    ledger.check(agent, T0)
    ledger.charge(agent.id, 1, T0)
    with pytest.raises(BudgetExhausted):
        ledger.check(agent, T0)


def test_charges_expire_late_never_early() -> None:
    ledger = BudgetLedger()
    agent = make_agent(budget=10)
    ledger.charge(agent.id, 10, T0 + 1)  # rounds up to the next second
    with pytest.raises(BudgetExhausted) as err:
        ledger.check(agent, T0 + WINDOW_MS + 1)
    assert err.value.details["frees_at_ms"] == T0 + 1000 + WINDOW_MS


def test_budgets_are_per_agent() -> None:
    ledger = BudgetLedger()
    a, b = make_agent(budget=10, agent_id="a@local"), make_agent(budget=10, agent_id="b@local")
    ledger.charge(a.id, 50, T0)
    with pytest.raises(BudgetExhausted):
        ledger.check(a, T0)
    ledger.check(b, T0)


def test_state_is_bounded() -> None:
    ledger = BudgetLedger()
    for i in range(20_000):  # 20 000 dispatches, 0.5 s apart: 10 000 s of history
        ledger.charge("a@local", 1, T0 + i * 500)
    assert len(ledger) <= WINDOW_MS // 1000 + 1
    ledger.prune(T0 + 10**9)
    assert len(ledger) == 0


def test_rebuilt_from_records_after_restart() -> None:
    agent = make_agent(budget=1000)
    records = [
        (agent.id, 800, T0 - WINDOW_MS - 1000),  # older than the hour: ignored
        (agent.id, 700, T0 - 10_000),
        (agent.id, 400, T0 - 5_000),
        ("other@local", 5000, T0 - 1000),
    ]
    ledger = BudgetLedger.from_records(records, T0)
    assert ledger.spent(agent.id, T0) == 1100
    with pytest.raises(BudgetExhausted) as err:
        ledger.check(agent, T0)
    assert err.value.details["frees_at_ms"] == T0 - 10_000 + WINDOW_MS


def test_negative_charge_is_refused() -> None:
    with pytest.raises(ValueError):
        BudgetLedger().charge("a@local", -1, T0)
