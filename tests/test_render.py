"""Terminal normalisation and the FINAL_ANSWER block (exact texts from the TS seed)."""

from __future__ import annotations

from a2a_orchestrator.events import Done, Failed, InputRequired
from a2a_orchestrator.render import (
    DID_NOT_FINISH,
    TRUNCATED,
    count_tokens,
    normalise,
    render_final_answer,
    truncate_to_budget,
)


def test_fixed_texts() -> None:
    assert normalise(Done(text="  \n")) == ("completed", "(subagent completed without output)")
    assert normalise(Done(text="result")) == ("completed", "result")
    assert normalise(Failed(reason="max_turns", message="x")) == (
        "failed",
        "subagent exhausted its step budget before finishing\n\n" + DID_NOT_FINISH,
    )
    assert normalise(Failed(reason="aborted", message="x")) == (
        "failed",
        "subagent was aborted\n\n" + DID_NOT_FINISH,
    )
    no_frame = Failed(reason="error", message="subagent stream ended without a terminal frame")
    assert normalise(no_frame)[1].startswith("subagent stream ended without a terminal frame\n\n")
    assert normalise(Failed(reason="timeout", message="timed out after 60 s"))[1] == (
        "timed out after 60 s\n\n" + DID_NOT_FINISH
    )
    assert normalise(InputRequired(question="?"))[0] == "failed"
    assert DID_NOT_FINISH == (
        "The subagent did not finish. Spawn it again if the task is still needed."
    )


def test_final_answer_block() -> None:
    assert render_final_answer("parent-1", "child-7", "all good") == (
        "Message Type: FINAL_ANSWER\nTask name: parent-1\nSender: child-7\nPayload:\nall good"
    )


def test_budget_by_bisection() -> None:
    short = "fits easily"
    assert truncate_to_budget(short) == short
    text = " ".join(f"token{i}" for i in range(2000))
    cut = truncate_to_budget(text, budget=900)
    assert cut.endswith(TRUNCATED)
    assert count_tokens(cut) <= 900
    # The longest prefix that fits: one more word would not.
    body = cut[: -len(TRUNCATED)]
    assert text.startswith(body)
    next_word = text[len(body) :].split()[0]
    assert count_tokens(body + " " + next_word + TRUNCATED) > 900
    assert count_tokens("") == 0 and count_tokens("a") == 1
