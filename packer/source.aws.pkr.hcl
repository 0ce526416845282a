# AWS: an EBS-backed AMI. IMDSv2 only, encrypted volumes, SSH from this machine's address
# only, optional spot build. Lines marked `# packer>=1.7` are settings Packer 1.6.6 does not
# know; scripts/packer-validate strips them (and only them) to validate with 1.6.6.

source "amazon-ebs" "gpu" {
  region        = var.aws_region
  instance_type = var.aws_spot ? "" : var.aws_instance_type
  subnet_id     = var.aws_subnet_id

  spot_price          = var.aws_spot ? "auto" : ""
  spot_instance_types = var.aws_spot ? var.aws_spot_instance_types : []

  source_ami_filter {
    filters = {
      name                = local.aws.name
      architecture        = "x86_64"
      root-device-type    = "ebs"
      virtualization-type = "hvm"
    }
    owners      = [local.aws.owner]
    most_recent = true
  }

  ssh_username = local.aws.user

  # The temporary security group admits SSH from this machine's public address only,
  # not from anywhere.
  temporary_security_group_source_public_ip = true # packer>=1.7

  # The build instance answers IMDSv2 only; the AMI asks every instance for the same.
  metadata_options { # packer>=1.7
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }
  imds_support = "v2.0" # packer>=1.7

  launch_block_device_mappings {
    device_name           = local.aws.root
    volume_size           = var.aws_volume_size
    volume_type           = "gp3"
    iops                  = 3000
    throughput            = 125
    encrypted             = true
    kms_key_id            = var.aws_kms_key_id
    delete_on_termination = true
  }
  encrypt_boot = true
  kms_key_id   = var.aws_kms_key_id

  ami_name        = local.image_name
  ami_description = local.description
  ami_users       = var.aws_ami_users

  tags            = local.tags
  snapshot_tags   = local.tags
  run_tags        = local.tags
  run_volume_tags = local.tags
}
