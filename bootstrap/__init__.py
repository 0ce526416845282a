"""kiln's launcher: host lists, topology, SSH mesh and training runs across nodes."""
