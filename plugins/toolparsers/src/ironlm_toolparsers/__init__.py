"""ironlm-toolparsers plugin."""
