"""Executors: in-process (uni) and multiprocess."""
