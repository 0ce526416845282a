"""Compute Engine: plan decides every request (pure), cloud makes the google-cloud-compute calls, provider is what
kiln's tasks see."""
