"""AWS: plan decides every request (pure), cloud makes the boto3 calls, provider is what kiln's tasks see."""
