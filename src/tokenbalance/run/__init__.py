"""What a run is before and beside its training: its setup (:mod:`.setup`, :mod:`.examples`) and its run directory:
state (:mod:`.state`), lock (:mod:`.lock`), checkpoints (:mod:`.checkpoints`), repairs and resumable settings
(:mod:`.repair`, :mod:`.resume`), a grid's plan (:mod:`.plan`) and records (:mod:`.records`), the verl cell
(:mod:`.cell`). Below the trainer; importing the package loads nothing. Guarantees: docs/reliability.md."""
