#!/usr/bin/env python3
"""classify_ticket: read a ticket on stdin, print "billing" or "technical".

Deterministic keyword rule: any billing word wins, everything else is technical.
"""

import sys

BILLING = ("invoice", "refund", "charge", "charged", "billing", "payment", "price", "subscription")


def classify(text: str) -> str:
    lowered = text.lower()
    return "billing" if any(word in lowered for word in BILLING) else "technical"


if __name__ == "__main__":
    print(classify(sys.stdin.read()))
