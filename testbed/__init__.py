"""Local test infrastructure that stands in for cloud machines: clusters of sshd nodes in network namespaces
(testbed.cluster, planned by testbed.netns) and qemu VMs booted like cloud instances (testbed.vm, testbed.vmspec).
"""
