# Docker: a container image from the same playbook, run through Packer's docker builder
# (built into Packer 1.6.6). The container runs on the host's network, so apt reaches its
# mirrors and the wheelhouse on 127.0.0.1 without the engine's NAT (kiln's engines run with
# --iptables=false). The image's own entrypoint and command (a shell, kept alive by -i -t)
# stay, so the committed image keeps them. Ansible reaches it through the docker connection
# (the container's id, see the build), never over SSH: a container has no sshd. The committed
# image carries the matrix as labels; make image tags it kiln:PROFILE-FINGERPRINT and pushes
# it where asked.

source "docker" "container" {
  image       = var.docker_base_image
  pull        = var.docker_pull
  commit      = true
  run_command = ["-d", "-i", "-t", "--network=host", "--", "{{.Image}}"]
  changes     = local.docker_changes
}
