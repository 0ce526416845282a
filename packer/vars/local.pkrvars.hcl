# Local defaults: `make image PROVIDER=local` (qemu, TCG, the cpu profile). make passes the
# base disk's files from `scripts/base-image --print` (DIR/disk.qcow2, vmlinuz, initrd.img,
# bake_key) as local_base_disk, local_kernel, local_initrd and local_ssh_private_key_file.
profile                = "cpu"
local_output_directory = "build/image/local/disk"
local_vm_name          = "kiln.qcow2"
local_disk_size        = "16G"
local_cpus             = 2
local_memory           = 4096
