# The one build: every source runs the same steps.
#   1. ansible/image.yml (the bake; profile from var.profile)
#   2. fetch /etc/kiln/manifest.json (versions of everything installed) to versions.json
#   3. ansible/cleanup.yml (image_cleanup: host keys, authorized_keys, machine-id, ... and
#      the checks that they are gone)
#   4. packer-manifest.json (artifact ids, with profile and fingerprint)
# Ansible connects to the VM directly (use_proxy = false): Packer 1.6.6's proxy offers only
# ssh-rsa host keys, which OpenSSH 9 refuses. Host keys stay checked (see locals.pkr.hcl).
# A container is reached by its id through Ansible's docker connection (no SSH at all).

build {
  sources = [
    "source.amazon-ebs.gpu",
    "source.googlecompute.gpu",
    "source.azure-arm.gpu",
    "source.qemu.local",
    "source.docker.container",
  ]

  # A fresh per-build known_hosts file (and the folder the records go to).
  provisioner "shell-local" {
    inline = [
      "mkdir -p '${var.output_directory}'",
      "rm -f '${local.known_hosts_file}'",
    ]
  }

  provisioner "ansible" {
    command          = var.ansible_playbook_command
    playbook_file    = "${local.ansible_directory}/image.yml"
    use_proxy        = false
    ansible_env_vars = local.ansible_env_vars
    extra_arguments  = ["--extra-vars", local.ansible_extra_vars]

    inventory_file_template = source.type == "docker" ? local.docker_inventory : ""
  }

  provisioner "file" {
    direction   = "download"
    source      = "/etc/kiln/manifest.json"
    destination = "${var.output_directory}/versions.json"
  }

  provisioner "ansible" {
    command          = var.ansible_playbook_command
    playbook_file    = "${local.ansible_directory}/cleanup.yml"
    use_proxy        = false
    ansible_env_vars = local.ansible_env_vars
    extra_arguments  = ["--extra-vars", local.ansible_extra_vars]

    inventory_file_template = source.type == "docker" ? local.docker_inventory : ""
  }

  # The recorded key dies with the build: cleanup removed it from the image and every
  # instance makes its own at first boot.
  provisioner "shell-local" {
    inline = ["rm -f '${local.known_hosts_file}'"]
  }

  post-processor "manifest" {
    output     = "${var.output_directory}/packer-manifest.json"
    strip_path = true
    custom_data = {
      profile     = var.profile
      fingerprint = var.fingerprint
      base_os     = var.base_os
      image_name  = local.image_name
    }
  }
}
