# Inputs of the kiln image build. Common inputs first, then one group per provider
# (aws_, gcp_, azure_, local_). Per-provider defaults live in vars/<provider>.pkrvars.hcl;
# `make image` adds the fingerprint and the version matrix.
#
# Validation conditions use regex_replace(), not can(regex()): Packer 1.6.6 (Debian's)
# evaluates regex() to an error, and both versions agree on regex_replace().

# --- common -----------------------------------------------------------------------------

variable "profile" {
  type        = string
  default     = "gpu"
  description = "Image profile handed to ansible/image.yml as kiln_image_profile: gpu (NVIDIA driver, CUDA, cuDNN, NCCL, container toolkit) or cpu."

  validation {
    condition     = var.profile == "gpu" || var.profile == "cpu"
    error_message = "The profile must be gpu or cpu."
  }
}

variable "fabric" {
  type        = string
  default     = "none"
  description = "The GPU fabric's stack the gpu profile bakes in, handed to ansible/image.yml as kiln_image_fabric: efa (AWS), infiniband (Azure's RDMA sizes) or none. vars/aws.pkrvars.hcl and vars/azure.pkrvars.hcl set it."

  validation {
    condition     = var.fabric == "none" || var.fabric == "efa" || var.fabric == "infiniband"
    error_message = "The fabric must be none, efa or infiniband."
  }
}

variable "base_os" {
  type        = string
  default     = "ubuntu-24.04"
  description = "Base OS of the cloud images: ubuntu-22.04, ubuntu-24.04 or debian-12. The local image is always the Debian 12 base disk (local_base_disk)."

  validation {
    condition     = var.base_os == "ubuntu-22.04" || var.base_os == "ubuntu-24.04" || var.base_os == "debian-12"
    error_message = "The base_os must be ubuntu-22.04, ubuntu-24.04 or debian-12."
  }
}

variable "image_name_prefix" {
  type        = string
  default     = "kiln"
  description = "First part of every image name: PREFIX-PROFILE-FINGERPRINT12-TIMESTAMP (lowercase letters, digits, '-'; GCP image names allow nothing else)."

  validation {
    condition     = length(var.image_name_prefix) >= 1 && length(var.image_name_prefix) <= 24 && regex_replace(var.image_name_prefix, "^[a-z][a-z0-9-]*$", "") == ""
    error_message = "The image_name_prefix must be 1-24 characters of a-z, 0-9 and '-', starting with a letter."
  }
}

variable "fingerprint" {
  type        = string
  description = "Input fingerprint of this bake (lowercase hex, 8-64 digits): a hash of everything the image is made from. Tagged on the image; an unchanged fingerprint lets `make image` skip the bake."

  validation {
    condition     = length(var.fingerprint) >= 8 && length(var.fingerprint) <= 64 && regex_replace(var.fingerprint, "^[0-9a-f]+$", "") == ""
    error_message = "The fingerprint must be 8-64 lowercase hex digits."
  }
}

variable "versions" {
  type        = map(string)
  description = "The version matrix (ansible/group_vars/all/versions.yml), keyed by its Ansible variable names, e.g. tensorflow_version = \"2.18.1\". Only labels the image (tag kiln:<name without _version>); Ansible reads the matrix itself."

  validation {
    condition     = length(var.versions) > 0 && length([for name, version in var.versions : name if regex_replace(name, "^[a-z][a-z0-9_]*$", "") != "" || version == ""]) == 0
    error_message = "The versions map must not be empty; names are lowercase Ansible variable names and every version is non-empty."
  }
}

variable "ansible_playbook_command" {
  type        = string
  default     = "ansible-playbook"
  description = "Path (or name on PATH) of the ansible-playbook that runs ansible/image.yml, e.g. .venv/bin/ansible-playbook."

  validation {
    condition     = var.ansible_playbook_command != ""
    error_message = "The ansible_playbook_command must not be empty."
  }
}

variable "ansible_extra_vars" {
  type        = map(string)
  default     = {}
  description = "Extra variables for the playbooks (mirror URLs, role switches), merged with kiln_image_profile = profile and passed as one JSON --extra-vars. Never put secrets here: Packer prints the command line."
}

variable "ansible_directory" {
  type        = string
  default     = ""
  description = "The ansible/ folder with image.yml, cleanup.yml and ansible.cfg. Empty means ../ansible next to this template folder; set it when Packer reads a copy of the templates (scripts/packer-validate on Packer < 1.7)."
}

variable "output_directory" {
  type        = string
  default     = "build/image"
  description = "Folder on this machine for the bake's records: versions.json (the image's /etc/kiln/manifest.json), packer-manifest.json and a per-build known_hosts. No whitespace."

  validation {
    condition     = var.output_directory != "" && regex_replace(var.output_directory, "\\s", "") == var.output_directory
    error_message = "The output_directory must be a non-empty path without whitespace."
  }
}

# --- aws (amazon-ebs "gpu") -------------------------------------------------------------

variable "aws_region" {
  type        = string
  default     = "us-east-1"
  description = "AWS region the AMI is built in."
}

variable "aws_instance_type" {
  type        = string
  default     = "c6i.2xlarge"
  description = "Build instance type. No GPU needed: the driver is installed, not loaded."
}

variable "aws_spot" {
  type        = bool
  default     = false
  description = "Build on a spot instance (spot_price auto, first available of aws_spot_instance_types)."
}

variable "aws_spot_instance_types" {
  type        = list(string)
  default     = ["c6i.2xlarge", "c6a.2xlarge", "m6i.2xlarge"]
  description = "Instance types a spot build may use, in order of preference."

  validation {
    condition     = length(var.aws_spot_instance_types) > 0
    error_message = "The aws_spot_instance_types list must name at least one instance type."
  }
}

variable "aws_volume_size" {
  type        = number
  default     = 60
  description = "Root volume size in GiB (CUDA, cuDNN, NCCL and TensorFlow need about 25)."

  validation {
    condition     = var.aws_volume_size >= 20
    error_message = "The aws_volume_size must be at least 20 GiB."
  }
}

variable "aws_kms_key_id" {
  type        = string
  default     = ""
  description = "KMS key (id, ARN or alias) encrypting the build volume and the AMI; empty uses the account's default EBS key."
}

variable "aws_subnet_id" {
  type        = string
  default     = ""
  description = "Subnet of the build instance (it needs a public IP or a route from this machine); empty uses the default VPC."
}

variable "aws_ami_users" {
  type        = list(string)
  default     = []
  description = "AWS account ids the AMI is shared with."
}

# --- gcp (googlecompute "gpu") ----------------------------------------------------------

variable "gcp_project_id" {
  type        = string
  default     = ""
  description = "GCP project the image is built and stored in (required for a GCP build)."
}

variable "gcp_zone" {
  type        = string
  default     = "us-central1-a"
  description = "Zone of the build VM."
}

variable "gcp_machine_type" {
  type        = string
  default     = "n2-standard-8"
  description = "Build VM machine type. No GPU needed."
}

variable "gcp_disk_size" {
  type        = number
  default     = 60
  description = "Boot disk size in GB."

  validation {
    condition     = var.gcp_disk_size >= 20
    error_message = "The gcp_disk_size must be at least 20 GB."
  }
}

variable "gcp_subnetwork" {
  type        = string
  default     = ""
  description = "Subnetwork of the build VM; empty uses the project's default network."
}

variable "gcp_network_tags" {
  type        = list(string)
  default     = ["kiln-packer"]
  description = "Network tags of the build VM, for a firewall rule that admits SSH from the builder's address only (GCP has no per-build security group)."
}

variable "gcp_secure_boot" {
  type        = bool
  default     = true
  description = "Shielded VM Secure Boot on the build VM. The NVIDIA modules are built, not loaded, during the bake; instances that boot the image with Secure Boot need signed modules."
}

# --- azure (azure-arm "gpu") ------------------------------------------------------------

variable "azure_use_cli_auth" {
  type        = bool
  default     = true
  description = "Authenticate with the Azure CLI login (az login); false uses azure_client_id / azure_client_secret."
}

variable "azure_subscription_id" {
  type        = string
  default     = ""
  description = "Azure subscription of the build."
}

variable "azure_tenant_id" {
  type        = string
  default     = ""
  description = "Azure tenant (service principal logins)."
}

variable "azure_client_id" {
  type        = string
  default     = ""
  description = "Service principal application id (when azure_use_cli_auth is false)."
}

variable "azure_client_secret" {
  type        = string
  default     = ""
  sensitive   = true
  description = "Service principal secret (when azure_use_cli_auth is false). Pass it as PKR_VAR_azure_client_secret, never in a var file."
}

variable "azure_location" {
  type        = string
  default     = "eastus"
  description = "Azure region of the build VM and the managed image."
}

variable "azure_resource_group" {
  type        = string
  default     = "kiln-images"
  description = "Existing resource group that receives the managed image."
}

variable "azure_vm_size" {
  type        = string
  default     = "Standard_D8s_v5"
  description = "Build VM size. No GPU needed."
}

variable "azure_os_disk_size_gb" {
  type        = number
  default     = 64
  description = "OS disk size in GB."

  validation {
    condition     = var.azure_os_disk_size_gb >= 30
    error_message = "The azure_os_disk_size_gb must be at least 30 GB."
  }
}

variable "azure_gallery_name" {
  type        = string
  default     = ""
  description = "Azure Compute Gallery (shared image gallery) that also receives the image; empty publishes the managed image only."
}

variable "azure_gallery_resource_group" {
  type        = string
  default     = ""
  description = "Resource group of azure_gallery_name."
}

variable "azure_gallery_image_name" {
  type        = string
  default     = "kiln"
  description = "Image definition in the gallery (it must exist, Linux, generalized, Gen2)."
}

variable "azure_gallery_image_version" {
  type        = string
  default     = "0.0.0"
  description = "Gallery image version MAJOR.MINOR.PATCH for this bake."

  validation {
    condition     = regex_replace(var.azure_gallery_image_version, "^[0-9]+\\.[0-9]+\\.[0-9]+$", "") == ""
    error_message = "The azure_gallery_image_version must look like 1.2.3."
  }
}

variable "azure_gallery_replication_regions" {
  type        = list(string)
  default     = []
  description = "Regions the gallery image version is replicated to (besides azure_location)."
}

# --- local (qemu "local") ---------------------------------------------------------------

variable "local_base_disk" {
  type        = string
  default     = "build/base/disk.qcow2"
  description = "The Debian 12 base disk (qcow2) made by scripts/base-image (disk.qcow2 in the folder `scripts/base-image --print` names); Packer copies it and boots the copy."
}

variable "local_base_disk_checksum" {
  type        = string
  default     = "none"
  description = "Checksum of local_base_disk: none (it is made here) or sha256:<64 hex digits>."

  validation {
    condition     = var.local_base_disk_checksum == "none" || (length(var.local_base_disk_checksum) == 71 && regex_replace(var.local_base_disk_checksum, "^sha256:[0-9a-f]+$", "") == "")
    error_message = "The local_base_disk_checksum must be none or sha256:<64 lowercase hex digits>."
  }
}

variable "local_kernel" {
  type        = string
  default     = "build/base/vmlinuz"
  description = "Kernel of the base disk, booted directly (-kernel): vmlinuz beside disk.qcow2."
}

variable "local_initrd" {
  type        = string
  default     = "build/base/initrd.img"
  description = "Initrd of the base disk (-initrd): initrd.img beside disk.qcow2."
}

variable "local_ssh_private_key_file" {
  type        = string
  default     = "build/base/bake_key"
  description = "Private key whose public half is root's authorized key on the base disk: bake_key beside disk.qcow2 (image_cleanup removes the authorization from the image)."
}

variable "local_output_directory" {
  type        = string
  default     = "build/image/local/disk"
  description = "Folder that receives the baked qcow2. It must not exist yet (Packer refuses to overwrite it)."
}

variable "local_vm_name" {
  type        = string
  default     = "kiln.qcow2"
  description = "File name of the baked qcow2 inside local_output_directory."
}

variable "local_disk_size" {
  type        = string
  default     = "16G"
  description = "Size of the copied disk (e.g. 16G): the base disk's size (scripts/base-image makes 16G); Packer cannot shrink it, and a larger disk needs the root file system grown at boot."

  validation {
    condition     = regex_replace(var.local_disk_size, "^[1-9][0-9]*[MG]$", "") == ""
    error_message = "The local_disk_size must be a size like 12G or 12288M."
  }
}

variable "local_cpus" {
  type        = number
  default     = 2
  description = "Virtual CPUs of the build VM (-smp)."

  validation {
    condition     = var.local_cpus >= 1
    error_message = "The local_cpus must be at least 1."
  }
}

variable "local_memory" {
  type        = number
  default     = 4096
  description = "Memory of the build VM in MiB."

  validation {
    condition     = var.local_memory >= 1024
    error_message = "The local_memory must be at least 1024 MiB."
  }
}

variable "local_ssh_timeout" {
  type        = string
  default     = "15m"
  description = "How long to wait for SSH on the booting VM (TCG boots in about 40 s; allow for a loaded host)."
}

variable "local_serial_log" {
  type        = string
  default     = ""
  description = "File that receives the VM's serial console (kernel and systemd messages); empty discards it."
}

# --- docker (docker "container") --------------------------------------------------------

variable "docker_base_image" {
  type        = string
  default     = "kiln-base:debian12"
  description = "Image the container bake starts from: the local Debian 12 base (bake/container_base.py makes kiln-base:debian12-KEY) on the cpu profile, NVIDIA's CUDA/cuDNN image at the matrix's versions on gpu."

  validation {
    condition     = var.docker_base_image != "" && regex_replace(var.docker_base_image, "\\s", "") == var.docker_base_image
    error_message = "The docker_base_image must be an image reference without whitespace."
  }
}

variable "docker_pull" {
  type        = bool
  default     = false
  description = "Pull docker_base_image before the build (true for a registry image such as NVIDIA's; false for one made on this machine)."
}
