"""The local cloud kiln's `--provider local`, `make demo` and `make verify` run on: clusters of sshd nodes in network
namespaces (localcloud.cluster, planned by localcloud.netns), with their Docker engines and registry
(localcloud.engines, localcloud.registry) and their metadata services (localcloud.imds), and qemu VMs booted like
cloud instances (localcloud.vm, localcloud.vmspec). It imports nothing of testbed/."""
