"""Executors: where the workers live. ``uni`` runs the one worker in the engine's process."""
