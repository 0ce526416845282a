# GCP defaults: `make image PROVIDER=gcp GCP_PROJECT=...` (Application Default Credentials).
profile          = "gpu"
base_os          = "ubuntu-22.04"
gcp_zone         = "us-central1-a"
gcp_machine_type = "n2-standard-8"
gcp_disk_size    = 60
gcp_secure_boot  = true
