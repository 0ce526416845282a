"""kiln's Fabric entry point: `fab -H h1,h2,h3 cluster.train` (see `fab --list`)."""

from invoke import Collection

from bootstrap import tasks

cluster = Collection("cluster")
for name in ("mesh_", "check", "sync", "train", "status", "logs", "stop"):
    cluster.add_task(getattr(tasks, name))

ns = Collection(cluster)
