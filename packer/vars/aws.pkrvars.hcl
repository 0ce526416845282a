# AWS defaults: `make image PROVIDER=aws` (credentials from the usual AWS chain).
profile           = "gpu"
fabric            = "efa"
base_os           = "ubuntu-22.04"
aws_region        = "us-east-1"
aws_instance_type = "c6i.2xlarge"
aws_spot          = false
aws_volume_size   = 60
