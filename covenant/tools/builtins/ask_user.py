"""``rune@ask-user``: end the intent's turn with a question to the user, and wait for the answer.

The call itself does nothing in the daemon: its result carries the question
as :attr:`~covenant.tools.result.ToolResult.asks`, and the Rune loop ends the
turn there with the question as the intent's answer, marked
``input_required`` in the dispatch record. The user's answer is the next
intent in the same session — over A2A, a message naming the task, which
stands ``INPUT_REQUIRED`` with the question as its status message until then
(docs/a2a.md, "Multi-turn tasks").
"""

from __future__ import annotations

from covenant.tools.builtins.base import Builtin, BuiltinCall
from covenant.tools.result import ToolResult

__all__ = ["TOOL", "QUESTION_MAX_CHARS"]

QUESTION_MAX_CHARS = 2000

_NOTE = "the question was put to the user; their answer comes as the next user message"


async def _run(call: BuiltinCall) -> ToolResult:
    question = call.arguments["question"].strip()
    return ToolResult(ok=True, content={"asked": True, "note": _NOTE}, asks=question)


TOOL = Builtin(
    name="rune@ask-user",
    description="Ask the user a question you need answered before you can go on. Your turn ends here: the "
    "question is shown to the user, and their answer arrives as the next user message.",
    parameters={
        "type": "object",
        "properties": {"question": {"type": "string", "minLength": 1, "maxLength": QUESTION_MAX_CHARS,
                                    "pattern": r"\S"}},
        "required": ["question"],
        "additionalProperties": False,
    },
    run=_run,
)
