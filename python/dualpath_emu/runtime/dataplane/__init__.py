"""The data-plane service of a real-time run, and the data plane that reaches it from other processes.

All transfers' rates are one max-min solution over all ports, so one process, the **data-plane service**
(:mod:`.service`), owns the run's only core; every other process reaches it through the same interface
(:class:`~dualpath_emu.runtime.core_work.CoreWork`) as a :class:`~.remote.RemoteDataPlane`. The wire format is
:mod:`.protocol` (docs/wire.md), the clock handshake :mod:`.clock_sync`. Nothing is imported here.

What a remote plane requests in one loop iteration travels as one ``submit``, submitted at once
(:func:`~dualpath_emu.runtime.virtual.submit_batch`: a refused request gets its own error); completions come back in
one ``done`` per requester per wake-up. The remote plane's clock is the service's within ± RTT/2 (NTP-style, the best
of ``SYNC_ROUNDS`` pings; across hosts the drift is measured by every heartbeat, not corrected). Each side fails a peer
silent for ``heartbeat_timeout_s``. The driver's process says its run is complete, the service tells the others to
``stop``, and once every requester said ``bye`` and the core is idle, ``DataPlaneService.serve`` returns. A
``replaceable`` process that died may be replaced by a higher ``incarnation``: its decode nodes drop every request,
and what it asked the core to move is tallied per ``(port, lane)`` for the bytes check (the report's ``replaced``).
"""
