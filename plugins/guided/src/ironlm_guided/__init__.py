"""ironlm-guided plugin."""
