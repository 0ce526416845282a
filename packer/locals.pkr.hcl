# Everything derived from the inputs: names, tags and labels, per-OS lookups, the
# Ansible hand-over. Sources and the build only read these.

locals {
  timestamp  = formatdate("YYYYMMDDhhmmss", timestamp())
  image_name = "${var.image_name_prefix}-${var.profile}-${substr(var.fingerprint, 0, 12)}-${local.timestamp}"

  ansible_directory = var.ansible_directory != "" ? var.ansible_directory : "${path.root}/../ansible"

  # One JSON --extra-vars for both playbooks. kiln_image_profile comes last so a stray
  # ansible_extra_vars entry cannot change the profile. ansible_host_key_checking undoes
  # what Packer's ansible provisioner always exports without an ssh_host_key_file
  # (ANSIBLE_HOST_KEY_CHECKING off); an extra var outranks the environment.
  ansible_extra_vars = jsonencode(merge(var.ansible_extra_vars, {
    kiln_image_profile        = var.profile
    kiln_image_fabric         = var.fabric
    ansible_host_key_checking = "true"
  }))

  # Host key of the build VM: trust on first use, recorded in a file that belongs to this
  # build only (emptied when the build starts, removed after the last playbook) and checked
  # on every later connection. The VM was just launched by Packer itself over a connection
  # it made; nothing else is trusted and no global known_hosts is written.
  known_hosts_file = "${var.output_directory}/build-known-hosts"
  ansible_env_vars = [
    "ANSIBLE_CONFIG=${local.ansible_directory}/ansible.cfg",
    "ANSIBLE_SSH_COMMON_ARGS=-o UserKnownHostsFile=${local.known_hosts_file} -o StrictHostKeyChecking=accept-new",
  ]

  # Tags (AWS, Azure): kiln:profile, kiln:fingerprint and kiln:<component> per matrix
  # entry, named by the Ansible variable without its _version suffix
  # (tensorflow_version -> kiln:tensorflow, nvidia_driver_branch -> kiln:nvidia_driver_branch).
  tags = merge(
    { for name, version in var.versions : "kiln:${trimsuffix(name, "_version")}" => version },
    {
      "kiln:profile"     = var.profile
      "kiln:fingerprint" = var.fingerprint
      "kiln:base-os"     = var.base_os
      "Name"             = local.image_name
    },
  )

  # GCP labels allow only [a-z0-9_-] (keys start with a letter) and 63 characters:
  # kiln:tensorflow = 2.18.1 becomes kiln-tensorflow = 2-18-1. The full fingerprint is in
  # the image description; the label keeps its first 63 digits.
  labels = {
    for key, value in local.tags :
    substr(regex_replace(lower(key), "[^a-z0-9_-]", "-"), 0, 63) => substr(regex_replace(lower(value), "[^a-z0-9_-]", "-"), 0, 63)
    if key != "Name"
  }

  description = "kiln ${var.profile} image, ${var.base_os}, fingerprint ${var.fingerprint}"

  # Base images per OS.
  aws_base = {
    "ubuntu-22.04" = { name = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*", owner = "099720109477", user = "ubuntu", root = "/dev/sda1" }
    "ubuntu-24.04" = { name = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*", owner = "099720109477", user = "ubuntu", root = "/dev/sda1" }
    "debian-12"    = { name = "debian-12-amd64-*", owner = "136693071363", user = "admin", root = "/dev/xvda" }
  }
  gcp_base = {
    "ubuntu-22.04" = { family = "ubuntu-2204-lts", project = "ubuntu-os-cloud" }
    "ubuntu-24.04" = { family = "ubuntu-2404-lts-amd64", project = "ubuntu-os-cloud" }
    "debian-12"    = { family = "debian-12", project = "debian-cloud" }
  }
  azure_base = {
    "ubuntu-22.04" = { publisher = "Canonical", offer = "0001-com-ubuntu-server-jammy", sku = "22_04-lts-gen2" }
    "ubuntu-24.04" = { publisher = "Canonical", offer = "ubuntu-24_04-lts", sku = "server" }
    "debian-12"    = { publisher = "Debian", offer = "debian-12", sku = "12-gen2" }
  }
  aws   = local.aws_base[var.base_os]
  gcp   = local.gcp_base[var.base_os]
  azure = local.azure_base[var.base_os]

  # The container image's settings (docker commit --change): the matrix and the bake as
  # labels (kiln.<name without _version>, kiln.profile, kiln.fingerprint), the image's Python
  # first on PATH and legacy Keras (Keras 3 breaks Horovod's callbacks).
  # Ansible reaches the build container by its id, as root inside it (no sudo there).
  docker_inventory = "{{ .HostAlias }} ansible_connection=docker ansible_host={{ .ID }} ansible_user=root ansible_become=false\n"

  docker_changes = concat(
    [for name, version in var.versions : "LABEL kiln.${trimsuffix(name, "_version")}=${version}"],
    [
      "LABEL kiln.profile=${var.profile}",
      "LABEL kiln.fingerprint=${var.fingerprint}",
      "ENV PATH=/opt/kiln/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "ENV TF_USE_LEGACY_KERAS=1",
      "ENV LANG=C.UTF-8",
    ],
  )

  # Direct kernel boot of the local base disk. Only switches Packer does not set itself:
  # its -drive, -netdev (with the SSH port forward), -device, -machine (accel=tcg), -m and
  # -smp (from cpus) stay as Packer makes them. -cpu max: TensorFlow wheels need AVX, which
  # TCG emulates only with this model.
  local_qemuargs = concat(
    [
      ["-kernel", var.local_kernel],
      ["-initrd", var.local_initrd],
      ["-append", "root=/dev/vda rw console=ttyS0 net.ifnames=0"],
      ["-cpu", "max"],
    ],
    var.local_serial_log != "" ? [["-serial", "file:${var.local_serial_log}"]] : [],
  )
}
