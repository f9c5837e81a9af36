"""The one Protocol every planner rule implements, and the decisions rules record.

A rule is a small module: it reads the statistics and the decisions taken before it
(rules run in order, as an optimizer's passes do) and records its own decisions, each
with the figures that drove it, so that ``Plan.explain()`` can show a person why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

__all__ = ["Decision", "Rule", "latest_decision"]


@dataclass(frozen=True)
class Decision:
    """One physical choice.

    ``topic`` says what kind of choice it is (``"small_side"``, ``"memtable"``, ...),
    ``subject`` what it is about (a join, an index, a source, a change batch), ``choice``
    the value taken (JSON-able), ``reason`` one sentence for a person, ``figures`` the
    numbers the reason quotes, ``rule`` the rule that took it.
    """

    topic: str
    subject: str
    choice: Any
    reason: str
    figures: Mapping[str, Any] = field(default_factory=dict)
    rule: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (``choice`` and ``figures`` are JSON-able by contract)."""
        return {"topic": self.topic, "subject": self.subject, "choice": self.choice,
                "reason": self.reason, "figures": dict(self.figures), "rule": self.rule}


def latest_decision(decisions: Sequence[Decision], topic: str, subject: str
                    ) -> Decision | None:
    """The last of ``decisions`` on ``topic`` about ``subject``, or None.

    Rules run in order and a later rule may revise an earlier choice, so the last
    recorded decision is the one in force.
    """
    for d in reversed(decisions):
        if d.topic == topic and d.subject == subject:
            return d
    return None


@runtime_checkable
class Rule(Protocol):
    """A planner rule: statistics and earlier decisions in, decisions out.

    ``apply`` must not mutate ``context``; it returns its decisions and the planner
    records them (in order) before the next rule runs.
    """

    name: str

    def apply(self, context: Any) -> Iterable[Decision]:
        """The decisions this rule takes for ``context`` (may be none)."""
        ...
