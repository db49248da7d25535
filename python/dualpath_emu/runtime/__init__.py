"""The runtime: what runs engines, in virtual time or live (docs/architecture.md).

Nothing is imported here, so importing the engine contract loads neither asyncio nor ZeroMQ: import the module
you need. :mod:`dualpath_emu.runtime.engine` is the engine contract (state machines fed inputs with the time,
outputs to an outbox and a data plane); :mod:`dualpath_emu.runtime.virtual` the virtual-time driver that steps
engines over the in-process core without asyncio. Live: :mod:`dualpath_emu.runtime.engine_actor` is the shell
around each engine, :mod:`dualpath_emu.runtime.actors` and :mod:`dualpath_emu.runtime.zmq_transport` carry its
messages in a process and between processes (:mod:`dualpath_emu.runtime.security`: who may use it, a run's CURVE
keys), :mod:`dualpath_emu.runtime.realtime` the event loop on a data plane's clock and a process's own core,
:mod:`dualpath_emu.runtime.core_work` the live data planes' common part, :mod:`dualpath_emu.runtime.dataplane`
the data-plane service that owns a real-time run's only core and the :class:`RemoteDataPlane` that reaches it;
:mod:`dualpath_emu.runtime.app` the applications and backends a run names, :mod:`dualpath_emu.runtime.launcher`
and :mod:`dualpath_emu.runtime.node` what starts and runs a live run's processes."""
