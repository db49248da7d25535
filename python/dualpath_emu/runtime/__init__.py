"""The runtime: what runs engines, in virtual time or live (docs/architecture.md has a map of its modules).

Nothing is imported here, so importing the engine contract (:mod:`dualpath_emu.runtime.engine`) loads neither asyncio
nor ZeroMQ: import the module you need."""
