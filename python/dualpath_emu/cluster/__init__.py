"""The emulated DualPath cluster: catalog, compute model, scheduler, engines, storage and the systems built from them."""
