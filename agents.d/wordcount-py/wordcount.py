#!/usr/bin/env python3
"""wordcount: one JSON intent on stdin, one JSON result on stdout.

Counts the words, lines and characters of the intent's text and lists the
three most frequent words (ties broken alphabetically), so the same text
always gives the same answer. Standard library only.
"""

import json
import re
import sys
from collections import Counter

WORD = re.compile(r"[^\W_]+(?:['-][^\W_]+)*")


def stats(text: str) -> str:
    words = WORD.findall(text)
    lines = len(text.splitlines()) if text else 0
    top = sorted(Counter(w.lower() for w in words).items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    frequent = ", ".join(f"{word} ({count})" for word, count in top) or "none"
    return f"words: {len(words)}, lines: {lines}, characters: {len(text)}; most frequent: {frequent}"


def main() -> int:
    intent = None
    try:
        intent = json.loads(sys.stdin.readline())
        intent_id = intent["id"]
        text = intent["text"]
        if not isinstance(text, str):
            raise TypeError("text must be a string")
    except (ValueError, KeyError, TypeError) as exc:
        print(f"wordcount: bad intent: {exc}", file=sys.stderr)
        intent_id = intent.get("id") if isinstance(intent, dict) else None
        result = {"intent_id": intent_id, "status": "error", "text": f"bad intent: {exc}", "sources": []}
    else:
        result = {"intent_id": intent_id, "status": "ok", "text": stats(text), "sources": []}
    sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
