#!/usr/bin/env python3
"""classify_ticket: a process tool. stdin {"ticket": "..."}, stdout {"category": "billing" | "technical"}.

Deterministic keyword rule: any billing word wins, everything else is technical.
One JSON document in, one out (docs/tools.md, "Process tools").
"""

import json
import sys

BILLING = ("invoice", "refund", "charge", "charged", "billing", "payment", "price", "subscription")


def classify(text: str) -> str:
    lowered = text.lower()
    return "billing" if any(word in lowered for word in BILLING) else "technical"


if __name__ == "__main__":
    arguments = json.load(sys.stdin)
    json.dump({"category": classify(arguments["ticket"])}, sys.stdout)
