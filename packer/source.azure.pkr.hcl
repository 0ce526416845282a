# Azure: a managed image, and a gallery image version when azure_gallery_name is set.
# Log in with `az login` (azure_use_cli_auth) or a service principal whose secret comes
# from the environment (PKR_VAR_azure_client_secret).

source "azure-arm" "gpu" {
  use_azure_cli_auth = var.azure_use_cli_auth
  subscription_id    = var.azure_subscription_id
  tenant_id          = var.azure_tenant_id
  client_id          = var.azure_client_id
  client_secret      = var.azure_client_secret

  location        = var.azure_location
  vm_size         = var.azure_vm_size
  os_type         = "Linux"
  image_publisher = local.azure.publisher
  image_offer     = local.azure.offer
  image_sku       = local.azure.sku
  os_disk_size_gb = var.azure_os_disk_size_gb

  managed_image_name                = local.image_name
  managed_image_resource_group_name = var.azure_resource_group

  dynamic "shared_image_gallery_destination" {
    for_each = var.azure_gallery_name != "" ? [var.azure_gallery_name] : []
    content {
      subscription        = var.azure_subscription_id
      resource_group      = var.azure_gallery_resource_group
      gallery_name        = shared_image_gallery_destination.value
      image_name          = var.azure_gallery_image_name
      image_version       = var.azure_gallery_image_version
      replication_regions = var.azure_gallery_replication_regions
    }
  }

  # Azure limits an image to 15 tags (Packer 1.6.6 checks it). Left out: the Name tag (AWS's idea), the
  # driver branch (the start of the driver version), the CUDA release NCCL was built for (the NCCL
  # package's suffix), AWS's EFA installer (never in an Azure image) and Slurm's lowest release (a floor,
  # not what is installed: the manifest says that); the fingerprint tag covers every entry of the matrix.
  azure_tags = {
    for key, value in local.tags : key => value
    if ! contains(["Name", "kiln:nvidia_driver_branch", "kiln:cuda_nccl_cuda", "kiln:efa_installer", "kiln:slurm_min_release"], key)
  }
}
