"""The host backend: the cluster moving real bytes (issue 16)."""
