"""The data-plane service of a real-time run, and the data plane that reaches it from other processes.

All transfers' rates are one max-min solution over all ports, so one process, the **data-plane service**
(:mod:`.service`), owns the run's only core and every port; every other process reaches it through the same
interface (:class:`~dualpath_emu.runtime.core_work.CoreWork`) as a :class:`~.remote.RemoteDataPlane` (:mod:`.remote`).
The wire format is :mod:`.protocol`, the clock handshake :mod:`.clock_sync`. Nothing is imported here.

**Batches.** What a remote plane requests in one loop iteration travels as one ``submit``; the service submits it at
once (:func:`~dualpath_emu.runtime.virtual.submit_batch`: a refused request gets its own error) and sends completions
back in one ``done`` per requester per wake-up. Tags are per requester. A detached request the core refuses fails the
requester's run (``DetachedRequestError``).

**One clock.** At connect the remote plane measures its offset to the service's clock NTP-style (the best of
``SYNC_ROUNDS`` pings): its ``clock_ns()`` is then the service's within ± RTT/2. Across hosts the clocks' drift is
not corrected, but every heartbeat is a fresh sample and ``clock_check`` in the remote's report measures it. The
remote records each completion's delivery lag, the service each batch's submission lag
(:class:`~dualpath_emu.runtime.lag.LagStats`).

**Heartbeats and the end.** Each side fails a peer silent for ``heartbeat_timeout_s`` (``DataPlaneLost``,
``RequesterLost``). The driver's process says its run is complete and the service tells the others to ``stop``; once
every expected requester said ``bye`` and the core is idle, ``DataPlaneService.serve`` returns.

**Restarted processes.** A ``replaceable`` process that died may be replaced by a hello with a higher
``incarnation``: the dead one's decode nodes drop every request, what the core completes for it is dropped, and the
end waits for the new one's bye. What each replaceable requester asked the core to move is tallied per
``(port, lane)``; the report's ``replaced`` gives each dead incarnation's tally, which the run's bytes check counts
for the ledger it never wrote.
"""
