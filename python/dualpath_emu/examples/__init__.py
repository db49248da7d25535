"""Examples that ship with the package: run them by module name from anywhere (``--system
dualpath_emu.examples.custom_policy:least-loaded``), or copy the file to start your own."""
