"""The start policy's evaluation shared between runs (``train.start_eval_cache``; ``tokenbalance ablate`` sets it for its
cells): the step-0 responses of each evaluation mode are generated once per policy, prompts and generation settings
and read by every other run that would generate the same ones, greedy for any seed and sampled per seed (the sampling
seed is the run's). What is shared is the generated ids; each run decodes and scores them with its own task, so the
metrics and per-example outcomes are the ones the run would have computed. docs/ablate.md ("Shared step-0
evaluations").

An entry is a directory ``CACHE/<mode>-<key>/`` holding ``responses.json``, written atomically by the run that
generated it while it held the entry's :class:`~tokenbalance.run.lock.RunLock`; a run that finds an entry locked
generates its other modes first and then waits for it. A run killed while generating leaves no file, and the kernel
releases its lock, so the next run generates the entry."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenbalance.outputs import write_text_atomic
from tokenbalance.run.lock import RunLock
from tokenbalance.trainer.evaluate import MODES, Generate

RESPONSES_FILE = "responses.json"
POLL_S = 5.0  # how often a run waiting for another run's entry looks again


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def generation_key(policy: str, settings: dict) -> str:
    """The key of the run's generation settings a mode's responses depend on (but the prompts, the mode and the seed,
    which :meth:`SharedEvaluation.entry` adds): the policy's digest and ``settings`` (engine, precision, lengths,
    device, versions; JSON-able)."""
    return _sha256(json.dumps({"policy": policy, **settings}, sort_keys=True, default=str))


@dataclass(frozen=True)
class SharedEvaluation:
    """Where the step-0 responses of one run's policy and settings (``key``) are shared; ``seed`` is the run's
    sampling seed (greedy responses do not depend on it, so they are shared across seeds)."""

    directory: Path
    key: str
    seed: int
    note: Callable[[str], None] = print
    poll_s: float = POLL_S

    def entry(self, mode: str, prompt_ids: Sequence[list[int]]) -> Path:
        """The entry of ``mode``'s responses to ``prompt_ids`` (``CACHE/<mode>-<16 hex>``): the key, the prompts' ids,
        the mode's temperature and, when it samples, the seed."""
        temperature = MODES[mode]
        seed = [self.seed] if temperature > 0 else []
        prompts = _sha256(json.dumps([list(ids) for ids in prompt_ids]))
        return (
            Path(self.directory) / f"{mode}-{_sha256(json.dumps([self.key, prompts, mode, temperature, *seed]))[:16]}"
        )

    def generations(self, generate: Generate, prompt_ids: Sequence[list[int]]) -> dict[str, list[list[int]]]:
        """Every mode's responses to ``prompt_ids``: read from its entry, or generated with ``generate(mode)`` and
        shared; a mode whose entry another run is generating is taken up after the rest."""
        entries = {mode: self.entry(mode, prompt_ids) for mode in MODES}
        found: dict[str, list[list[int]]] = {}
        told = False
        while len(found) < len(MODES):
            progressed = False
            for mode in [m for m in MODES if m not in found]:
                responses = self._read_or_generate(mode, entries[mode], generate)
                if responses is not None:
                    found[mode] = responses
                    progressed = True
            if len(found) < len(MODES) and not progressed:
                if not told:
                    told = True
                    busy = [m for m in MODES if m not in found]
                    self.note(
                        f"step-0 evaluation: waiting for another run generating {', '.join(busy)} in {self.directory}"
                    )
                time.sleep(self.poll_s)
        return {mode: found[mode] for mode in MODES}

    def _read_or_generate(self, mode: str, entry: Path, generate: Generate) -> list[list[int]] | None:
        """``mode``'s responses, or None while another run holds its ``entry``."""
        responses = read_entry(entry)
        if responses is not None:
            self.note(
                f"step-0 evaluation, {mode}: responses read from {entry} (generated earlier, by this or another run)"
            )
            return responses
        try:
            lock = RunLock(entry).acquire()
        except ValueError:
            return None
        try:
            responses = read_entry(entry)  # written while this run looked
            if responses is None:
                responses = generate(mode)
                document = {"mode": mode, "temperature": MODES[mode], "seed": self.seed, "key": self.key}
                write_text_atomic(entry / RESPONSES_FILE, json.dumps({**document, "responses": responses}) + "\n")
                self.note(f"step-0 evaluation, {mode}: responses generated and shared in {entry}")
            return responses
        finally:
            lock.release()


def read_entry(entry: Path) -> list[list[int]] | None:
    """The responses of a finished entry; None when it has none yet. An unreadable file is refused, naming it (it is
    written atomically, so only something else can have damaged it)."""
    path = Path(entry) / RESPONSES_FILE
    if not path.is_file():
        return None
    try:
        responses = json.loads(path.read_text())["responses"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a shared evaluation ({err}); move it away to generate it again") from None
    if not (isinstance(responses, list) and all(isinstance(r, list) for r in responses)):
        raise ValueError(f"{path}: not a shared evaluation (no list of responses); move it away to generate it again")
    return responses
