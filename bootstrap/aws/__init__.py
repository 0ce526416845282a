"""AWS clusters: bootstrap.aws.plan decides every request (pure); bootstrap.aws.cloud makes the boto3 calls."""
