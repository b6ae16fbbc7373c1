"""The installed environment: constraints.txt (the tested versions) agrees with pyproject.toml's
ranges and is what the README's commands install with; the ANTLR runtime is the one verl needs."""

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
GPU_CONSTRAINTS = ROOT / "constraints-gpu.txt"


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def test_antlr_runtime_is_4_9_and_math_verify_parses_with_it():
    """verl's hydra-core / omegaconf need antlr4-python3-runtime 4.9.*; math-verify prefers 4.13.2
    and got it on pip < 23.3 while the pin came through math-verify's extra (pyproject.toml)."""
    math_verify = pytest.importorskip("math_verify")
    installed = metadata.version("antlr4-python3-runtime")
    assert installed.startswith("4.9."), f"antlr4-python3-runtime {installed} is installed; pyproject.toml pins 4.9.3"
    assert math_verify.verify(math_verify.parse(r"$\frac{1}{2}$"), math_verify.parse("$0.5$"))


@pytest.mark.parametrize("constraints", [CONSTRAINTS, GPU_CONSTRAINTS], ids=lambda path: path.name)
def test_constraints_pin_versions_inside_pyproject_ranges(constraints):
    """Every pin in constraints.txt (and the GPU set's) is an exact version that pyproject.toml's own
    range for the package admits (else `pip install -c constraints.txt -e .` cannot resolve)."""
    tomllib = pytest.importorskip("tomllib")
    requirements = pytest.importorskip("packaging.requirements")
    utils = pytest.importorskip("packaging.utils")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [requirements.Requirement(text) for text in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        declared += [requirements.Requirement(text) for text in extra if not text.startswith("tokenbalance")]
    ranges = {}
    for requirement in declared:
        ranges.setdefault(utils.canonicalize_name(requirement.name), []).append(requirement.specifier)
    pins = [requirements.Requirement(line) for line in requirement_lines(constraints)]
    names = {utils.canonicalize_name(pin.name) for pin in pins}
    assert {"torch", "transformers", "tokenizers", "numpy", "antlr4-python3-runtime"} <= names
    for pin in pins:
        (spec,) = pin.specifier
        assert spec.operator == "==", f"{constraints.name}: {pin} is not an exact pin"
        for allowed in ranges.get(utils.canonicalize_name(pin.name), []):
            assert allowed.contains(spec.version, prereleases=True), f"{constraints.name}: {pin} is outside {allowed}"


# What the GPU set changes: verl's `vllm` extra pins torch / transformers, vLLM's mistral_common caps numpy.
GPU_ONLY = {"torch", "torchvision", "torchaudio", "vllm", "transformers", "numpy"}


def test_the_gpu_set_pins_what_the_cpu_set_pins_except_the_rollout_stack():
    """constraints-gpu.txt repeats the hosts and the math checker of constraints.txt at the same
    versions; only the packages verl's rollout engine decides differ (scripts/check_gpu_install.sh
    resolves it in CI)."""
    requirements = pytest.importorskip("packaging.requirements")
    utils = pytest.importorskip("packaging.utils")

    def pins(path):
        parsed = (requirements.Requirement(line) for line in requirement_lines(path))
        return {utils.canonicalize_name(pin.name): str(pin.specifier) for pin in parsed}

    cpu, gpu = pins(CONSTRAINTS), pins(GPU_CONSTRAINTS)
    assert GPU_ONLY <= set(gpu)
    shared = {name: spec for name, spec in gpu.items() if name not in GPU_ONLY}
    assert shared == {name: cpu.get(name) for name in shared}
    assert {"verl", "transferqueue", "trl", "math-verify", "antlr4-python3-runtime"} <= set(shared)


def test_installed_versions_match_the_constraints_when_asked():
    """In CI (scripts/test.sh installs with the constraints) the environment is exactly the pinned
    one. Elsewhere (a venv with the newest allowed releases) this is informational: set
    TOKENBALANCE_CHECK_CONSTRAINTS=1 to enforce it."""
    requirements = pytest.importorskip("packaging.requirements")
    if os.environ.get("TOKENBALANCE_CHECK_CONSTRAINTS") != "1":
        pytest.skip("TOKENBALANCE_CHECK_CONSTRAINTS=1 (scripts/test.sh sets it) enforces the pinned versions")
    wrong = []
    for line in requirement_lines(CONSTRAINTS):
        pin = requirements.Requirement(line)
        if pin.marker is not None and not pin.marker.evaluate():
            continue
        try:
            installed = metadata.version(pin.name)
        except metadata.PackageNotFoundError:
            continue  # an extra's package the environment does not hold
        if not pin.specifier.contains(installed.split("+")[0], prereleases=True):
            wrong.append(f"{pin.name} {installed} (constraints.txt: {pin.specifier})")
    assert wrong == [], "installed versions differ from constraints.txt: " + ", ".join(wrong)


def test_readme_commands_and_ci_install_with_the_constraints():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    installs = [part for part in re.split(r"&&|\n", first_block) if re.search(r"\bpip install\b", part)]
    assert installs and all("-c constraints.txt" in part for part in installs), installs
    assert "bash scripts/test.sh" in first_block
    script = (ROOT / "scripts" / "test.sh").read_text()
    project_installs = [line for line in script.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert project_installs and all("-c constraints.txt" in line for line in project_installs), project_installs
