"""What a run is before and beside its training: its setup (``setup.prepare``) and its run directory."""
