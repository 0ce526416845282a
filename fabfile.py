"""kiln's Fabric entry point: `fab -H h1,h2,h3 cluster.train` (see `fab --list`)."""

from bootstrap.tasks import namespace

ns = namespace()
