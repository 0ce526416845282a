"""kiln's Fabric entry point: `fab -H h1,h2,h3 cluster.train` (see `fab --list`)."""

from invoke import Collection

from bootstrap import aws_tasks, tasks

cluster = Collection("cluster")
for name in ("mesh_", "check", "sync", "train", "status", "logs", "stop"):
    cluster.add_task(getattr(tasks, name))
for name in ("up", "down", "list_", "sweep"):
    cluster.add_task(getattr(aws_tasks, name))

ns = Collection(cluster)
