"""The image pipeline on the operator's machine: matrix → packer (Ansible provisioner) → manifest → verify.

`make image` runs bake.image; `make validate` bake.validate; `make verify` bake.verify.
"""
