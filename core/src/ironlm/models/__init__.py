"""Model architectures built from ironlm.layers, registered through ``register_models``."""
