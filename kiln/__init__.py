"""kiln's core: what every room shares (errors, bounded subprocesses, host keys, waiting for SSH).

The rooms: `bake` (images), `bootstrap` (the launcher), `localcloud` (local nodes and VMs: the local provider),
`testbed` (the cloud stand-ins only the tests serve), `trainer`.
"""
