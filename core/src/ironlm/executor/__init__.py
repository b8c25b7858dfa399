"""Executors: where the workers live. ``uni`` runs the one worker in the engine's process,
``mp`` one process per rank on this machine, ``ray`` Ray actors on a Ray cluster."""
