"""The delivery check of a live run: across every process's event log, each message sent (``tell``) was
delivered (or dropped at a stopped actor) exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dualpath_emu.runtime.eventlog import read_events
from dualpath_emu.runtime.zmq_transport import MSG_IDS_PER_INCARNATION

__all__ = ["DeliveryReport", "check_delivery"]


@dataclass
class DeliveryReport:
    """Messages sent across the run, and those delivered (or dropped) a number of times other than once."""

    sent: int
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    lost_with_restart: int = 0
    """Messages to or from a restarted process's dead incarnation, not delivered or not on record: not an error."""
    to_stopped: int = 0
    """Messages told after their recipient had stopped and its process had gone: not an error."""

    @property
    def ok(self) -> bool:
        return not self.lost and not self.duplicated


def check_delivery(logs: list[Path], restarted: Mapping[str, int] | None = None) -> DeliveryReport:
    """Every ``tell`` across ``logs`` must be matched by exactly one ``deliver`` or ``drop`` (matched by summary: ids
    count per process). A message to or from a restarted process's actor (``restarted``: actor -> last incarnation) may
    be lost with the dead one: counted in ``lost_with_restart``; one told after its recipient stopped (the run's end
    racing its last messages) in ``to_stopped``."""
    sent: Counter[str] = Counter()
    arrived: Counter[str] = Counter()
    sent_ns: dict[str, int] = {}
    stopped_ns: dict[str, int] = {}
    for log in logs:
        for event in read_events(log):
            if event.kind == "tell":
                sent[event.summary] += 1
                sent_ns.setdefault(event.summary, event.t_ns)
            elif event.kind in ("deliver", "drop"):
                arrived[event.summary] += 1
            elif event.kind == "stop":
                stopped_ns.setdefault(event.actor, event.t_ns)
    report = DeliveryReport(sent=sum(sent.values()))
    restarted = restarted or {}

    def route(summary: str) -> tuple[str, str, str]:
        number, _, route = summary.partition(" ")
        sender, _, recipient = route.partition(" ")[2].partition("->")
        return number, sender, recipient

    def with_restart(summary: str, lost: bool) -> bool:
        number, sender, recipient = route(summary)
        last = restarted.get(sender)
        by_dead = last is not None and number[1:].isdigit() and int(number[1:]) < last * MSG_IDS_PER_INCARNATION + 1
        return by_dead or (lost and recipient in restarted)

    for summary in sorted(sent.keys() | arrived.keys()):
        if arrived[summary] < sent[summary]:
            if with_restart(summary, lost=True):
                report.lost_with_restart += sent[summary] - arrived[summary]
            elif sent_ns[summary] >= stopped_ns.get(route(summary)[2], 1 << 63):
                report.to_stopped += sent[summary] - arrived[summary]
            else:
                report.lost.append(summary)
        elif arrived[summary] > sent[summary]:
            if sent[summary] == 0 and arrived[summary] == 1 and with_restart(summary, lost=False):
                report.lost_with_restart += 1
            else:
                report.duplicated.append(summary)
    return report
