"""The client: the agents, replaying their trajectories turn by turn (§3.2)."""

from __future__ import annotations

from collections.abc import Sequence

from dualpath_emu.cluster.config import BLOCK_TOKENS
from dualpath_emu.cluster.context import Cluster
from dualpath_emu.cluster.engines import NS, ClusterEngine
from dualpath_emu.cluster.background import BACKGROUND
from dualpath_emu.cluster.messages import Start, Submit, Turn, TurnDone, TurnFailed, TurnsEnded, WhichEnded
from dualpath_emu.cluster.observations import Admitted, Arrival, Completion, WorkloadEnded
from dualpath_emu.runtime.engine import DataPlane, Outbox, on, seeded_random
from dualpath_emu.workload.trajectory import Trajectory
from dualpath_emu.workload.waits import WaitDraws

__all__ = ["Client"]


class Client(ClusterEngine):
    """Replays trajectories (§3.2): offline all agents at t = 0, online Poisson arrivals; a turn is submitted
    when its agent's previous one is done, after the tool wait (the trajectory's, else drawn for (seed, agent,
    turn): the same in every system; none by default). Traces with arrival times are replayed open loop. Hits
    are the agent's context so far (§3.4), rounded down to whole Full Blocks if configured."""

    def __init__(
        self, cluster: Cluster, trajectories: Sequence[Trajectory], seed: int, out: Outbox, plane: DataPlane
    ) -> None:
        super().__init__("client", cluster, out, plane)
        self.trajectories = trajectories
        self.random = seeded_random(seed, self.name)
        tool_wait = cluster.config.tool_wait
        # Each wait from (seed, agent, turn) alone, not from a stream drawn as turns end: the order they end in
        # differs between systems, and every system must see the same waits.
        self._draw_wait = WaitDraws(tool_wait, seed) if tool_wait.waits else None
        self._waits = self._draw_wait is not None or any(t.wait_s is not None for t in trajectories)
        """Whether any turn may wait (else a turn is submitted without looking)."""
        self._next_turn = [0] * len(trajectories)
        self._open = [len(t) for t in trajectories]  # Turns of each trajectory not done yet.
        self._context = [0] * len(trajectories)
        self._counted = [0] * len(trajectories)
        """Per agent, how many turns ``_context`` counts (its next hit is ``_context``)."""
        self._agent_of: dict[int, int] = {}
        self._next_rid = 0
        self._outbox: list[Turn] = []
        """Turns submitted at this instant, sent as one :class:`Submit` by :meth:`_send_turns`."""
        self._remaining = len(trajectories)  # Agents with turns to come (the workload ends at 0).
        self._arrivals: list[int] = []
        self._replayed: list[tuple[int, int, int]] = []
        self._next_replayed = 0
        self._start_ns = 0

    def _finish(self) -> None:
        self.out.observe(WorkloadEnded())  # where a driver stops

    @on(Start)
    def on_start(self, now: int, msg: Start, sender: str) -> None:
        if self.cluster.config.faults.any:  # the fault schedule's times count from the run's start, as the agents'
            self.out.send("faults", Start())
        if self.cluster.config.network.background:  # so does the background traffic's
            self.out.send(BACKGROUND, Start())
        if not self.trajectories:
            self._finish()
            return
        self._start_ns = now
        timed = [a for a, t in enumerate(self.trajectories) if t.arrival_s is not None]
        closed = [a for a, t in enumerate(self.trajectories) if t.arrival_s is None]
        if timed:  # open loop: every turn of the timed trajectories at its arrival time, in time order
            self._replayed = sorted(
                (round(t_s * NS), agent, turn)
                for agent in timed
                for turn, t_s in enumerate(self.trajectories[agent].arrival_s or ())
            )
            self._replay(now)
        if self.cluster.config.mode == "offline":
            for agent in closed:
                self._submit_next(now, agent)
            self._send_turns()
        elif closed:
            self._arrivals = closed[::-1]
            self._arrive(now)

    def _arrive(self, now: int) -> None:
        """Online: the next agent arrives now, the one after it a Poisson gap later."""
        self._submit_next(now, self._arrivals.pop())
        self._send_turns()
        if self._arrivals:
            self.plane.timer(now + round(self.random.expovariate(self.cluster.config.arrival_rate) * NS), self._arrive)

    def _replay(self, now: int) -> None:
        """Submit the replayed turns due by now; wake up for the next."""
        turns, index = self._replayed, self._next_replayed
        while index < len(turns) and self._start_ns + turns[index][0] <= now:
            _, agent, turn = turns[index]
            self._submit(now, agent, turn)
            index += 1
        self._next_replayed = index
        self._send_turns()
        if index < len(turns):
            self.plane.timer(self._start_ns + turns[index][0], self._replay)

    def _submit_next(self, now: int, agent: int) -> None:
        """The agent's next turn: now, or after its tool wait (then it is sent on its own when the wait ends)."""
        turn = self._next_turn[agent]
        if self._waits:
            wait_ns = self._wait_ns(agent, turn)
            if wait_ns:
                self.plane.timer(now + wait_ns, lambda at: self._after_wait(at, agent))
                return
        self._next_turn[agent] = turn + 1
        self._submit(now, agent, turn)

    def _wait_ns(self, agent: int, turn: int) -> int:
        """The tool wait before ``turn`` of ``agent`` (ns): its trajectory's, else (after its first turn) a draw."""
        waits = self.trajectories[agent].wait_s
        if waits is not None:
            return round(waits[turn] * NS)
        if self._draw_wait is None or turn == 0:
            return 0
        return round(self._draw_wait(agent, turn) * NS)

    def _after_wait(self, now: int, agent: int) -> None:
        turn = self._next_turn[agent]
        self._next_turn[agent] = turn + 1
        self._submit(now, agent, turn)
        self._send_turns()  # on its own: nothing else is being submitted at this instant

    def _submit(self, now: int, agent: int, turn: int) -> None:
        trajectory = self.trajectories[agent]
        append, gen = trajectory.append[turn], trajectory.gen[turn]
        if trajectory.hit is not None:
            hit = trajectory.hit[turn]
        elif turn == self._counted[agent]:  # an agent's turns come in order: its hit is its context so far
            hit = self._context[agent]
            self._context[agent] = hit + append + gen
            self._counted[agent] = turn + 1
        else:  # a replayed trajectory whose arrival times are not in turn order
            hit = sum(trajectory.append[:turn]) + sum(trajectory.gen[:turn])
        prompt = hit + append
        if self.cluster.config.hit_block_aligned:
            hit = hit // BLOCK_TOKENS * BLOCK_TOKENS
        rid = self._next_rid
        self._next_rid += 1
        self._agent_of[rid] = agent
        self.out.observe(Admitted(rid))
        self.out.observe(Arrival(rid, agent, prompt, hit, gen))
        self._outbox.append(Turn(rid, prompt, hit, gen, agent, turn == len(trajectory) - 1))

    def _send_turns(self) -> None:
        if self._outbox:
            self.out.send("scheduler", Submit(tuple(self._outbox)))
            self._outbox.clear()

    @on(TurnFailed)
    def on_turn_failed(self, now: int, msg: TurnFailed, sender: str) -> None:
        """These turns failed: each agent's trajectory ends here (a trace's other turns come as timed)."""
        for rid in msg.rids:
            agent = self._agent_of.pop(rid)
            trajectory = self.trajectories[agent]
            if trajectory.arrival_s is None:
                self._open[agent] = 0  # its remaining turns are never submitted
                self._next_turn[agent] = len(trajectory)
            else:
                self._open[agent] -= 1
            if self._open[agent] == 0:
                self._remaining -= 1
                if self._remaining == 0:
                    self._finish()

    @on(TurnDone)
    def on_turn_done(self, now: int, msg: TurnDone, sender: str) -> None:
        done_ns, observe = msg.done_ns, self.out.observe
        for rid, first_ns, second_ns in zip(msg.rids, msg.first_token_ns, msg.second_token_ns, strict=True):
            if rid not in self._agent_of:
                # Ended already: sent again by the scheduler after a decode group's process died. A turn ends once.
                continue
            observe(Completion(rid, first_ns, second_ns, done_ns))
            agent = self._agent_of.pop(rid)
            self._open[agent] -= 1
            trajectory = self.trajectories[agent]
            if trajectory.arrival_s is None and self._next_turn[agent] < len(trajectory):
                self._submit_next(now, agent)
            elif self._open[agent] == 0:
                self._remaining -= 1
                if self._remaining == 0:
                    self._finish()
        self._send_turns()

    @on(WhichEnded)
    def on_which_ended(self, now: int, msg: WhichEnded, sender: str) -> None:
        """A decode group's process died and was started again: say which of these turns have ended here."""
        agent_of = self._agent_of
        self.out.send("scheduler", TurnsEnded(msg.rids, tuple(rid for rid in msg.rids if rid not in agent_of)))
