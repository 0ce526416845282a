# Plugin pins for current Packer only: `packer init packer/plugins` installs them.
# Packer 1.6.6 (Debian's) has every builder built in and does not know this block, so it
# lives apart from the templates and 1.6.6 never reads this folder.

packer {
  required_version = ">= 1.14.0, < 2.0.0"

  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = "= 1.8.0"
    }
    googlecompute = {
      source  = "github.com/hashicorp/googlecompute"
      version = "= 1.2.5"
    }
    azure = {
      source  = "github.com/hashicorp/azure"
      version = "= 2.5.1"
    }
    qemu = {
      source  = "github.com/hashicorp/qemu"
      version = "= 1.1.5"
    }
    ansible = {
      source  = "github.com/hashicorp/ansible"
      version = "= 1.1.4"
    }
  }
}
