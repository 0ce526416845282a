"""kiln's core: what every room shares (errors, bounded subprocesses, host keys, waiting for SSH).

The rooms: `bake` (images), `bootstrap` (the launcher), `testbed` (local nodes and VMs), `trainer`.
"""
