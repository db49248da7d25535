"""The data-plane service of a real-time run, and the data plane that reaches it from other processes (issue 14).

In real time the rates of all transfers are one max-min solution over all ports, so one process, the **data-plane
service** (:mod:`.service`), owns the run's only core (``Core(clock="wall")``, its plane a ``ServiceCore``) and every
port; the actors of every other process reach it through the same data-plane interface
(:class:`~dualpath_emu.runtime.core_work.CoreWork`) as a :class:`~.remote.RemoteDataPlane` (:mod:`.remote`). Actor code
cannot tell which plane it has. The wire format is :mod:`.protocol`; the clock handshake :mod:`.clock_sync`. Nothing is
imported here: import the module you need.

**Batches.** The remote plane sends everything requested in one loop iteration as one ``submit`` message; the service
submits it to its core at once (one core call per kind, :func:`~dualpath_emu.runtime.virtual.submit_batch`: a refused
request gets its own error back) and sends completions back batched, one ``done`` message per requester per wake-up.
Detached work is never reported; a detached request the core refuses fails the requester's run
(``DetachedRequestError``). Tags are per requester: the service maps ``(requester, tag)`` to its own core tags.

**One clock.** At connect the remote plane measures its offset to the service's clock NTP-style (the ping with the
smallest round trip of ``SYNC_ROUNDS``); from then on its ``clock_ns()`` is the service's clock within ± RTT/2. On one
host both are the same ``CLOCK_MONOTONIC``; across hosts the clocks' drift (some ppm) is **not corrected**, but every
heartbeat is a fresh sample and ``clock_check`` in the remote's report measures it.

**Lags.** The remote plane records each completion's *delivery lag* (its clock at delivery minus the modelled
``end_ns``); the service each batch's *submission lag* (its clock at submission minus the requester's when the batch's
first request was made). Both are :class:`~dualpath_emu.runtime.lag.LagStats`.

**Heartbeats and the end.** Each side fails a peer silent for ``heartbeat_timeout_s`` (``DataPlaneLost``,
``RequesterLost``). A requester whose actors are done says ``bye``; the driver's process says its run is complete, and
the service tells every other requester to ``stop``; once every expected requester said bye and the core has no pending
work, ``DataPlaneService.serve`` returns and the caller writes its report.

**Restarted processes (issue 26).** A service given ``replaceable`` names lets a process of such a name that died be
replaced by a hello with a higher ``incarnation``. The dead one's decode nodes drop every request, what the core
completes for it afterwards is dropped (``completions_dropped``), frames from its connection are rejected, and the run's
end waits for the new one's bye. One the service cannot reach (``EHOSTUNREACH``) is dead at once; one silent for
``heartbeat_timeout_s`` is waited for ``connect_timeout_s`` more. What each replaceable requester asked the core to move
is tallied per ``(port, lane)`` as its ledger books it, and the report's ``replaced`` gives each replaced incarnation's
tally: the run's bytes check counts it for the ledger the dead process never wrote."""
