"""Plan rendering limits a user relies on: a pull-request comment never exceeds what the
forge accepts, and says what it left out."""

from __future__ import annotations

from controller.plan import ABSENT, Action, Change, FieldChange, Plan
from controller.render import MARKDOWN_LIMIT, render_markdown, render_text


def _big_plan(count: int) -> Plan:
    rules = [{"type": "tool_allowlist", "tools": [f"tool{i}.*" for i in range(20)]}]
    return Plan(
        tuple(
            Change(
                Action.CREATE,
                "Policy",
                f"policy-{i:05d}",
                f"00000000-0000-5000-8000-{i:012d}",
                "agent",
                None,
                {"name": f"policy-{i:05d}", "rules": rules},
                (FieldChange(("rules",), ABSENT, rules),),
                f"policies/p{i}.yaml:1",
            )
            for i in range(count)
        )
    )


def test_markdown_stays_within_the_comment_limit_and_says_what_it_left_out():
    markdown = render_markdown(_big_plan(2000))
    assert len(markdown) <= MARKDOWN_LIMIT
    assert markdown.startswith("### agentauth plan: 2000 to create, 0 to update, 0 to delete")
    shown = markdown.count("<details>")
    assert 0 < shown < 2000
    assert f"and {2000 - shown} more change(s), not shown" in markdown


def test_small_markdown_plan_shows_every_change():
    markdown = render_markdown(_big_plan(3))
    assert markdown.count("<details>") == 3
    assert "not shown" not in markdown


def test_text_is_plain_unless_styled():
    text = render_text(_big_plan(1))
    assert "\x1b[" not in text
    assert text.startswith("Plan: 1 to create, 0 to update, 0 to delete.")
