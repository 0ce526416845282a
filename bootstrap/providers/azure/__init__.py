"""Azure: plan decides every request (pure), cloud makes the Azure SDK calls, provider is what kiln's tasks see."""
