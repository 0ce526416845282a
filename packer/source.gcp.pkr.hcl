# GCP: a Compute Engine image in family PREFIX-PROFILE, built on a Shielded VM.
# Credentials come from Application Default Credentials (gcloud auth application-default login).

source "googlecompute" "gpu" {
  project_id   = var.gcp_project_id
  zone         = var.gcp_zone
  machine_type = var.gcp_machine_type
  subnetwork   = var.gcp_subnetwork
  tags         = var.gcp_network_tags

  source_image_family     = local.gcp.family
  source_image_project_id = [local.gcp.project]

  disk_size = var.gcp_disk_size
  disk_type = "pd-balanced"

  enable_secure_boot          = var.gcp_secure_boot
  enable_vtpm                 = true
  enable_integrity_monitoring = true

  ssh_username = "packer"

  image_name              = local.image_name
  image_family            = "${var.image_name_prefix}-${var.profile}"
  image_description       = local.description
  image_labels            = local.labels
  labels                  = local.labels
  image_guest_os_features = ["UEFI_COMPATIBLE", "VIRTIO_SCSI_MULTIQUEUE", "GVNIC"] # packer>=1.7
}
