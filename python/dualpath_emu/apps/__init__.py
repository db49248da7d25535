"""Applications that run on the actor runtime (see :mod:`dualpath_emu.runtime.app`)."""
