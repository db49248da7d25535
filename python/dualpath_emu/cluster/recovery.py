"""Engine-crash recovery (issue 26; docs/faults.md): the scheduler's component that takes requests back from an engine
group that crashed, was dropped by a fault, or whose process died and was started again, and dispatches them again
(or fails them past ``max_redispatches``), settling with the other engines and the client what each still holds.

:class:`CrashRecovery` keeps its own state and works on the :class:`~dualpath_emu.cluster.scheduler.Scheduler`'s
queues and loads through ``self.s``; the scheduler hands it :class:`Lost`, :class:`TurnsEnded` and the decode groups'
:class:`DecodeDone` records, and asks it when a group is back."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from dualpath_emu.cluster.identity import GroupId
from dualpath_emu.cluster.messages import DecodeDone, Drop, Lost, TurnDone, TurnFailed, TurnsEnded, WhichEnded
from dualpath_emu.cluster.observations import Failed, Redispatched

if TYPE_CHECKING:
    from dualpath_emu.cluster.scheduler import Scheduler

__all__ = ["CrashRecovery"]

_LAST_DONE: Final = (
    64  # DecodeDones kept per decode group: what a process killed could have sent without its TurnDones.
)


@dataclass(slots=True)
class _PrefillRestart:
    """A prefill group's restarted process: what it held, while the decode groups say what they have."""

    group: str
    waiting: set[str]  # Decode groups whose answer (Lost "dropped from") has not come.
    held: list[tuple[int, int, int]]
    """``(rid, pe, attempt)``: the requests the scheduler had sent it, as they were then."""
    dropped: list[int]
    kept: set[int]


def _group_id(name: str) -> GroupId:
    group = GroupId.parse(name)
    if group is None:
        raise ValueError(f"{name!r} is no engine group's name")
    return group


class CrashRecovery:
    """Requests lost to engine crashes, dropped reads and restarted processes, taken back and dispatched again."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self._recovering: dict[int, set[str]] = {}
        """Requests lost to a crash whose other engine has not yet confirmed it dropped them."""
        self._attempts: dict[int, int] = {}  # Requests dispatched again after a crash: how many times.
        self._causes: dict[int, str] = {}
        """Why a request being recovered was lost ("crash", "down" or "timeout"), until it is dispatched again."""
        # Processes that died and were started again (a live run's --restart-crashed): a process killed between
        # two sends of one handler may have sent one and not the other.
        self._last_done: dict[str, deque[DecodeDone]] = {}
        """Each decode group's last DecodeDones (what its TurnDones told the client, should they not have left)."""
        self._prefill_restarts: dict[int, _PrefillRestart] = {}
        """By number (a group's process may die again before the answers about the last death came)."""
        self._asked: dict[str, deque[int]] = {}
        """The prefill restarts each decode group was asked about (Drop naming their nodes), in order."""
        self._restarts = 0
        self._asking: set[int] = set()  # Requests the client was asked about (WhichEnded) and has not answered yet.
        self._parked: dict[int, str] = {}
        """Requests to dispatch again once the client says it has not ended them: who lost them."""
        self._client_ended: set[int] = set()
        """Requests the client ended whose recovery is still waiting for a drop: they end when it comes."""
        self._resend: dict[int, tuple[int, int, int]] = {}
        """Requests a dead decode group reported done, asked about: their TurnDone's times."""

    def decode_done(self, group: str, msg: DecodeDone) -> None:
        """Decode group ``group`` reported ``msg``: kept a while, should its process die before its TurnDones left."""
        last = self._last_done.get(group)
        if last is None:
            last = self._last_done[group] = deque(maxlen=_LAST_DONE)
        last.append(msg)

    def _groups_of(self, rid: int) -> set[str]:
        """The engine groups that hold request ``rid`` now (its PE's until its prefill is done, its DE's)."""
        groups = set()
        pe = self.s.pe_of.get(rid)
        if pe is not None and rid in self.s.de_of:  # before its decode fetch, no group has heard of it
            groups.add(self.s._pe_group_of[pe])
        de = self.s.de_of.get(rid)
        if de is not None:
            groups.add(self.s._de_group[de // self.s._gpus])
        return groups

    def lost(self, now: int, msg: Lost, sender: str) -> None:
        """Engine group ``sender`` no longer holds these requests (:class:`Lost` says why)."""
        if msg.why == "restarted":
            self._process_restarted(now, sender)
            return
        for node, tokens in zip(msg.read_nodes, msg.read_tokens, strict=True):
            self.s.read_q[node] -= tokens  # reads that will not end
        if msg.why == "dropped from":
            self._dropped_from(now, msg, sender)
            return
        if msg.why == "crash":
            self.engine_down(now, sender)
        for rid in msg.rids:
            waiting = self._recovering.get(rid)
            if waiting is not None:
                waiting.discard(sender)
                if not waiting:
                    del self._recovering[rid]
                    self._dispatch_again(now, rid, sender)
                continue
            if msg.why == "dropped" or rid not in self.s.requests or sender not in self._groups_of(rid):
                continue  # stale: it was lost here before, and is dispatched again already
            self._causes[rid] = msg.why
            self._recover(now, rid, sender)
        self.s._wake_prefill(now)

    def _process_restarted(self, now: int, group: str) -> None:
        """Engine group ``group`` is a new process in place of one that died: what was sent it is lost; a prefill
        group's requests are settled with the decode groups, a decode group's with the client."""
        nodes = [n for n, name in (*self.s._pe_group.items(), *self.s._de_group.items()) if name == group]
        for node in nodes:
            self.s.read_q[node] = 0
            if node in self.s._de:
                self._hbm_lost(node)
        for rid, waiting in list(self._recovering.items()):
            if group in waiting:
                waiting.discard(group)
                if not waiting:
                    del self._recovering[rid]
                    self._dispatch_again(now, rid, group)
        for number, restart in list(self._prefill_restarts.items()):  # a decode group that was asked: no answer comes
            if group in restart.waiting:
                restart.waiting.discard(group)
                if not restart.waiting:
                    self._settle_prefill_restart(now, number)
        self._asked.pop(group, None)
        prefill = group in self.s._pe_group.values()
        held = [rid for rid in self.s.requests if rid not in self._recovering and group in self._groups_of(rid)]
        if prefill:
            self._ask_decode_groups(now, group, nodes, held)
            held = self._queued_at(group)  # not sent yet
        else:
            self._ask_client(group, held)
        for rid in held:
            self._causes[rid] = "crash"
            self._recover(now, rid, group)
        self.s._wake_prefill(now)

    def _ask_decode_groups(self, now: int, group: str, nodes: list[int], held: list[int]) -> None:
        """Prefill group ``group``'s process died holding ``held``: settle them with the decode groups."""
        wake = None
        for rid, pe in list(self.s.pe_of.items()):
            if rid in self.s._decoded and self.s._pe_group_of[pe] == group:
                del self.s.pe_of[rid]
                wake = self.s._pe_done(self.s.requests.pop(rid), pe) or wake
                self.s._decoded.discard(rid)
        if wake is not None:
            self.s._notify_group(now, wake)
        waiting = {name for name in self.s._de_group.values() if name not in self.s._down}
        number = self._restarts = self._restarts + 1
        self._prefill_restarts[number] = _PrefillRestart(
            group, waiting, [(rid, self.s.pe_of[rid], self._attempts.get(rid, 0)) for rid in held], [], set()
        )
        for name in sorted(waiting):
            self._asked.setdefault(name, deque()).append(number)
            self.s.out.send(name, Drop((), tuple(nodes)))
        if not waiting:
            self._settle_prefill_restart(now, number)

    def _dropped_from(self, now: int, msg: Lost, sender: str) -> None:
        """A decode group's answer to a Drop naming a restarted prefill group's nodes."""
        queue = self._asked.get(sender)
        if not queue:
            return  # asked before it died itself: settled without it
        number = queue.popleft()
        restart = self._prefill_restarts[number]
        restart.dropped.extend(msg.rids)
        restart.kept.update(msg.kept)
        restart.waiting.discard(sender)
        if not restart.waiting:
            self._settle_prefill_restart(now, number)

    def _settle_prefill_restart(self, now: int, number: int) -> None:
        """Every decode group answered: a request one kept goes on there; one dropped or unknown is dispatched again."""
        restart = self._prefill_restarts.pop(number)
        group = restart.group
        wake = None
        again: list[int] = []
        for rid, pe, attempt in restart.held:
            if self.s.pe_of.get(rid) != pe or rid in self._recovering or self._attempts.get(rid, 0) != attempt:
                continue  # settled since (a PrefillDone cannot come from the dead process; a crash can)
            if rid in self.s._decoded:  # its DecodeDone came meanwhile: done
                del self.s.pe_of[rid]
                wake = self.s._pe_done(self.s.requests.pop(rid), pe) or wake
                self.s._decoded.discard(rid)
            elif rid not in self.s.de_of:
                continue
            elif rid in restart.kept:
                del self.s.pe_of[rid]
                wake = self.s._pe_done(self.s.requests[rid], pe) or wake
            else:
                again.append(rid)
        held = {rid for rid, _, _ in restart.held}
        # Dropped although its PrefillDone came: its KvReady never left the dead process.
        again += [rid for rid in restart.dropped if rid not in held and rid in self.s.de_of and rid not in self.s.pe_of
                  and rid not in self._recovering]  # fmt: skip
        for rid in again:
            self._causes[rid] = "crash"
            self._unassign(rid)
            self._dispatch_again(now, rid, group)
        if wake is not None:
            self.s._notify_group(now, wake)
        self.s._wake_prefill(now)

    def _ask_client(self, group: str, held: list[int]) -> None:
        """Decode group ``group``'s process died holding ``held``: ask the client which of these it has ended."""
        asked = list(held)
        for done in self._last_done.pop(group, ()):
            for rid, first, second in zip(done.rids, done.first_token_ns, done.second_token_ns, strict=True):
                self._resend[rid] = (first, second, done.done_ns)
                asked.append(rid)
        if asked:
            self._asking.update(asked)
            self.s.out.send("client", WhichEnded(tuple(asked)))

    def turns_ended(self, now: int, msg: TurnsEnded, sender: str) -> None:
        """The client's answer: what it ended is done; what it did not is dispatched again, or told done."""
        ended = set(msg.ended)
        for rid in msg.asked:
            self._asking.discard(rid)
            times = self._resend.pop(rid, None)
            if times is not None:
                if rid not in ended:  # its TurnDone never left the dead process
                    self.s.out.send("client", TurnDone((rid,), (times[0],), (times[1],), times[2]))
                continue
            lost_by = self._parked.pop(rid, None)
            if rid in ended:
                if lost_by is not None:
                    self._end(now, rid)
                elif rid in self.s.requests:
                    self._client_ended.add(rid)  # its recovery waits for a drop still
            elif lost_by is not None:
                self._dispatch_again(now, rid, lost_by)
        self.s._wake_prefill(now)

    def _end(self, now: int, rid: int) -> None:
        """Request ``rid``, taken back from its engines, had ended (its DecodeDone never came)."""
        self._causes.pop(rid, None)
        self._attempts.pop(rid, None)
        self.s._decoded.discard(rid)
        self.s._kv_ended(now, self.s.requests.pop(rid), done=True)

    def _recover(self, now: int, rid: int, lost_by: str) -> None:
        """Request ``rid`` was lost by ``lost_by``: free its place, have the other group drop it, dispatch it again."""
        others = self._groups_of(rid) - {lost_by}
        self._unassign(rid)
        if others:
            self._recovering[rid] = others
            for group in sorted(others):
                self.s.out.send(group, Drop((rid,)))
        else:
            self._dispatch_again(now, rid, lost_by)

    def _unassign(self, rid: int) -> None:
        """Undo request ``rid``'s assignment in the engines' loads (and its place in a decode queue)."""
        request = self.s.requests[rid]
        pe = self.s.pe_of.pop(rid, None)
        if pe is not None:
            self.s._pe_done(request, pe)
        de = self.s.de_of.pop(rid, None)
        if de is not None:
            self.s._free_de(request, de)
        elif pe is not None:  # assigned a PE only: it waits in a decode queue
            for queue in (self.s.decode_queue, *self.s.private.values()):
                if request in queue:
                    queue.remove(request)
                    routed = next((n for n, q in self.s.private.items() if q is queue), None)
                    if routed is not None:
                        self.s.group_loads[routed] -= self.s.policy.decode_tokens(request)
                    break

    def _queued_at(self, group: str) -> list[int]:
        """Requests assigned a PE of prefill group ``group``, waiting in a decode queue no group has heard of."""
        return [rid for rid, pe in self.s.pe_of.items()
                if rid not in self.s.de_of and rid not in self.s._decoded and self.s._pe_group_of[pe] == group]  # fmt: skip

    def _dispatch_again(self, now: int, rid: int, lost_by: str) -> None:
        """Queue request ``rid`` again, ahead of what came after it, or fail it past ``max_redispatches``."""
        if rid in self._client_ended:
            self._client_ended.discard(rid)
            self._end(now, rid)
            return
        if rid in self._asking:
            self._parked[rid] = lost_by
            return
        attempt = self._attempts.get(rid, 0) + 1
        cause = self._causes.pop(rid, "crash")
        if attempt > self.s.cluster.config.max_redispatches:
            self._attempts.pop(rid, None)
            self.s._kv_ended(now, self.s.requests.pop(rid), done=False)
            what = f"engine {lost_by} crashed" if cause == "crash" else f"its hit KV read on {lost_by} timed out"
            reason = f"lost {attempt} times, the last: {what}"
            self.s.out.observe(Failed(rid, reason))
            self.s.out.send("client", TurnFailed((rid,), (reason,)))
            return
        self._attempts[rid] = attempt
        self.s.out.observe(Redispatched(rid, attempt, lost_by))
        self.s.prefill_queue.appendleft(self.s.requests[rid])

    def _hbm_lost(self, node: int) -> None:
        """Decode node ``node``'s engines lost their HBM: what they kept across turns is gone."""
        retention, gpus = self.s.retention, self.s._gpus
        if retention is not None:
            retention.drop_engines(range(node * gpus, (node + 1) * gpus))

    def engine_down(self, now: int, group: str) -> None:
        """Group ``group`` crashed: no fetches until back, down to policies, its unsent requests taken back."""
        self.s._down.add(group)
        self.s._pulls.pop(group, None)
        self.s._wanted.discard(group)
        group_id = _group_id(group)
        if group_id.prefill:
            for rid in self._queued_at(group):  # in a decode queue, its PE gone: dispatched again
                self._unassign(rid)
                self._dispatch_again(now, rid, group)
        else:
            node = group_id.node
            self._hbm_lost(node)
            queue = self.s.private.pop(node)
            del self.s.group_loads[node]
            self.s.decode_queue.extendleft(reversed(queue))  # not sent there yet: routed again
            queue.clear()
        self.s._route_engines()

    def engine_up(self, now: int, group: str) -> None:
        """Engine group ``group`` is back, empty."""
        self.s._down.discard(group)
        self.s._route_engines()
        group_id = _group_id(group)
        if not group_id.prefill:
            node = group_id.node
            self.s.private[node] = self.s._private_of[node]
            loads = dict(self.s.group_loads)
            loads[node] = sum(e.tok for e in self.s._de[node])
            self.s.group_loads.clear()
            self.s.group_loads.update(sorted(loads.items()))
            self.s._route(now)
        else:
            self.s._wake_prefill(now)
