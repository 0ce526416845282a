# Local: the Debian 12 base disk from scripts/base-image, booted under qemu with TCG
# (nested KVM hangs on this kind of host) by direct kernel boot, provisioned over SSH as
# root and written as a standalone qcow2. Its kernel and initrd travel with the image.

source "qemu" "local" {
  accelerator = "tcg"

  # With disk_image the base disk is still named by iso_url (Packer copies it).
  disk_image   = true
  iso_url      = var.local_base_disk
  iso_checksum = var.local_base_disk_checksum

  format         = "qcow2"
  disk_interface = "virtio"
  disk_size      = var.local_disk_size
  net_device     = "virtio-net"
  cpus           = var.local_cpus
  memory         = var.local_memory
  headless       = true
  qemuargs       = local.local_qemuargs

  communicator         = "ssh"
  ssh_username         = "root"
  ssh_private_key_file = var.local_ssh_private_key_file
  ssh_timeout          = var.local_ssh_timeout
  shutdown_command     = "systemctl poweroff"

  output_directory = var.local_output_directory
  vm_name          = var.local_vm_name
}
