# Azure defaults: `make image PROVIDER=azure` after `az login`. The resource group must exist.
profile               = "gpu"
base_os               = "ubuntu-22.04"
azure_use_cli_auth    = true
azure_location        = "eastus"
azure_resource_group  = "kiln-images"
azure_vm_size         = "Standard_D8s_v5"
azure_os_disk_size_gb = 64
