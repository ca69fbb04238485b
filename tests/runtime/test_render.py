"""Terminal normalisation and the FINAL_ANSWER block (exact texts from the TS seed)."""

from __future__ import annotations

from a2a_orchestrator.runtime.budgets import Spend
from a2a_orchestrator.runtime.events import Done, Failed, InputRequired
from a2a_orchestrator.runtime.render import (
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
    over = Failed(reason="budget", message="budget exhausted: tokens 360 of 250 (spent ...)")
    assert normalise(over)[1] == (
        "subagent stopped by its budget: tokens 360 of 250 (spent ...)\n\n" + DID_NOT_FINISH
    )
    assert normalise(InputRequired(question="?"))[0] == "failed"
    assert DID_NOT_FINISH == (
        "The subagent did not finish. Spawn it again if the task is still needed."
    )


def test_final_answer_block() -> None:
    assert render_final_answer("parent-1", "child-7", "all good") == (
        "Message Type: FINAL_ANSWER\nTask name: parent-1\nSender: child-7\nPayload:\nall good"
    )
    # With the child's subtree usage, a line between the sender and the payload.
    spent = Spend(input_tokens=100, output_tokens=20, model_calls=1, seconds=0.25)
    assert render_final_answer("p", "c", "ok", spent).split("\n")[3] == (
        "Usage: 120 tokens (100 in, 20 out), 1 model calls, 0.2 s (this child and its children)"
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


def test_a_long_failure_keeps_its_closing_sentence() -> None:
    status, payload = normalise(Failed(reason="error", message="Traceback line\n" * 3000))
    cut = truncate_to_budget(payload)
    assert status == "failed"
    # Only the failure text is cut; the parent still reads what to do.
    assert cut.endswith(TRUNCATED + "\n\n" + DID_NOT_FINISH)
    assert cut.startswith("Traceback line\n") and count_tokens(cut) <= 900
    block = render_final_answer("parent", "child", payload)
    assert block.endswith(DID_NOT_FINISH) and TRUNCATED in block
    # A completed result that merely ends with the same words is not special:
    # it is a payload like any other, and the sentence is what gets cut.
    done = "x " * 3000 + DID_NOT_FINISH
    assert truncate_to_budget(done).endswith(TRUNCATED)


def test_cjk_and_code_are_cut_near_a_real_tokenizer_budget() -> None:
    chinese = "子智能体是独立运行的会话\uff0c完成后把结果回注到父会话。" * 200
    cut = truncate_to_budget(chinese)
    body = cut[: -len(TRUNCATED)]
    assert chinese.startswith(body) and count_tokens(cut) <= 900
    # About a token per character: 900 tokens are some 700-900 characters,
    # not the ~3 600 the old per-word estimate let through.
    assert 600 <= len(body) <= 900
    code = "def f(x):\n    return {k: v**2 for k, v in x.items() if v}\n" * 200
    body = truncate_to_budget(code)[: -len(TRUNCATED)]
    assert code.startswith(body) and 2000 <= len(body) <= 3500
