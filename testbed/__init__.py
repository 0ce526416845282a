"""Stand-ins only the tests use, for the cloud APIs that have no emulator: Compute Engine (testbed.gce) and Azure
Resource Manager (testbed.arm), each serving the published API over HTTP(S) with its faults. They build on the local
cloud (localcloud/: host keys, quiet servers); nothing outside the tests imports them."""
