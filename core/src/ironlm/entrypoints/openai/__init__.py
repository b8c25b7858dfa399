"""The OpenAI-compatible server (``ironlm serve``): FastAPI app, protocol models, endpoints."""
