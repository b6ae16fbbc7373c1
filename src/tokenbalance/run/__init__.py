"""What a run is before and beside its training: its setup (:mod:`.setup`: ``prepare(config)``, the checks before
work; :mod:`.examples`) and everything its run directory is: files and state (:mod:`.state`), lock (:mod:`.lock`),
checkpoints (:mod:`.checkpoints`), the repairs after a kill and the settings a resume may change (:mod:`.repair`,
:mod:`.resume`), the plan a grid takes for it (:mod:`.plan`), the records a grid keeps (:mod:`.records`) and the verl
cell's sittings (:mod:`.cell`).

Below the trainer: nothing here imports it. Importing this package loads nothing (a verl cell runs :mod:`.cell` where
only the standard library is needed). docs/reliability.md says what each guarantees."""
