"""The testbed benchmarks run end to end on a tiny policy (so they do not rot between the sittings
that use them), and the decode limit counts the arithmetic and memory a decode needs."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.models.helpers import tiny_model
from tokenbalance.models import load_policy

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def decode_limit():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import decode_limit

        yield decode_limit
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_the_decode_limit_counts_every_product_and_every_read(decode_limit):
    model = tiny_model("llama")
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    q_o = 2 * c.hidden_size * c.num_attention_heads * head_dim
    k_v = 2 * c.hidden_size * c.num_key_value_heads * head_dim
    per_layer = q_o + k_v + 3 * c.hidden_size * c.intermediate_size
    per_token = 2 * (c.num_hidden_layers * per_layer + c.hidden_size * c.vocab_size)
    assert decode_limit.linear_flops_per_token(model) == per_token
    # two prompts of 3 and 2 tokens, two rows each, responses of 1, 4 / 2, 2 tokens
    prompts, lengths_B = [[5, 6, 7], [8, 9]], torch.tensor([1, 4, 2, 2])
    attention = lambda context: 4 * c.num_hidden_layers * c.num_attention_heads * head_dim * context  # noqa: E731
    prefill = 5 * per_token + sum(attention(k) for k in (1, 2, 3, 1, 2))
    decode = (
        9 * per_token + sum(attention(3 + k) for k in (1, 1, 2, 3, 4)) + sum(attention(2 + k) for k in (1, 2, 1, 2))
    )
    assert decode_limit.necessary_flops(model, prompts, 2, lengths_B) == prefill + decode
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4
    weights = sum(p.numel() * 4 for p in model.parameters())
    reads = 4 * weights + (4 * 3 + 2 * 2) * kv + (0 + 6 + 1 + 1) * kv
    assert decode_limit.necessary_bytes(model, prompts, 2, lengths_B) == reads


@pytest.mark.parametrize("script", ["compaction.py", "decode_limit.py"])
@pytest.mark.slow  # a benchmark script end to end: in the slow tier, which scripts/test.sh and CI run after the default suite
def test_the_testbed_benchmarks_run_on_a_tiny_policy(tiny_policy_dir, script):
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / script),
            "--model",
            str(tiny_policy_dir),
            "--max-new-tokens",
            "6",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tables = [block.splitlines() for block in done.stdout.split("\n\n") if block.startswith("| ")]
    table = [line for line in tables[0] if line.startswith("| ") and "---" not in line]
    assert len(table) == (5 if script == "compaction.py" else 3)  # the header and one row per case
    if script == "compaction.py":
        assert all(line.rstrip(" |").endswith("True") for line in table[1:])  # compaction changes no token
    else:
        shares = [float(cell.strip(" %")) for line in table[1:] for cell in line.split("|")[6::2] if cell.strip()]
        # timings: only that each share is a printed percentage (a loaded machine rounds one to 0%)
        assert len(shares) == 6 and all(share >= 0 for share in shares)
        # then each case's operator profile: a header naming the case, operators with their shares
        profiles = tables[1:]
        assert [p[0].split("|")[1].strip() for p in profiles] == [
            "operator (RL step, 8 prompts x 8, T = 1)",
            "operator (evaluation, 32 prompts, greedy)",
        ]
        for profile in profiles:
            operator_shares = [float(line.split("|")[4].strip(" %")) for line in profile[2:] if line.startswith("| ")]
            assert operator_shares and sum(operator_shares) <= 100 + len(operator_shares)  # rounded percentages


@pytest.mark.slow  # a benchmark script end to end (seconds at one repeat, but it multiplies output-layer-sized products)
def test_the_bfloat16_product_benchmark_reports_every_shape():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bf16_products.py"), "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "GFLOP/s" not in line]
    assert [row.split("|")[1].strip().split(" (")[0] for row in rows] == [
        "attention q/o",
        "MLP up",
        "MLP down",
        "output layer",
    ]
    for row in rows:
        f32, bf16, ratio = (cell.strip() for cell in row.split("|")[2:5])
        assert float(f32) > 0 and float(bf16) > 0
        # the ratio is the two rates' (printed to 0.01; each rate rounded to 0.05 GFLOP/s, so within that rounding)
        rounding = 0.005 + 0.05 / float(f32) + 0.05 * float(bf16) / float(f32) ** 2
        assert abs(float(ratio.rstrip("x")) - float(bf16) / float(f32)) <= rounding * 1.01


@pytest.mark.slow  # a benchmark script end to end: three RL steps of the tiny policy per round, two rounds
def test_the_mixed_precision_benchmark_times_every_contender(tiny_policy_dir):
    small = ["rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "data.eval_count=2"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "mixed_precision.py"), "--model", str(tiny_policy_dir), "--rounds", "1"]
        + [arg for setting in small for arg in ("--set", setting)]
        + ["--per-forward-casts"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [cell.strip() for cell in rows[0]] == [
        "phase",
        "float32 (s)",
        "bfloat16 autocast (s)",
        "bfloat16, casts per forward (s)",
        "float32 / bfloat16",
    ]
    assert [row[0].strip() for row in rows[1:]] == ["rollout", "logprob", "update", "step"]
    step = [float(cell.strip().rstrip("x")) for cell in rows[-1][1:]]
    assert all(value > 0 for value in step)
    ratio = step[0] / step[1]  # the printed ratio is that of the printed seconds, up to their rounding to 0.001 s
    assert abs(step[3] - ratio) <= 0.005 + 0.0005 * (1 / step[1] + step[0] / step[1] ** 2) * 1.01
    cast_line = done.stdout.strip().splitlines()[-1]
    assert cast_line.startswith("paired step ratio, casts per forward / kept: ") and float(cast_line[45:-1]) > 0


@pytest.mark.slow  # a benchmark script end to end: two log-prob passes per copy on a small batch
def test_the_reference_benchmark_times_both_copies_and_finds_the_same_bits(tiny_policy_dir):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "reference_forward.py"), "--model", str(tiny_policy_dir), "--rounds", "1"]
        + ["--rows", "4", "--prompt-tokens", "8", "--response-tokens", "6"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[0].strip() for row in rows] == ["reference weights", "converted per forward", "stored in bfloat16"]
    converted_mib, stored_mib = (float(row[2]) for row in rows[1:])
    policy, _ = load_policy(tiny_policy_dir)
    total = sum(p.numel() * 4 for p in policy.parameters())
    head, embedding = policy.get_output_embeddings().weight, policy.get_input_embeddings().weight
    assert head is embedding  # tied: the fixture's policy
    linear = [p for m in policy.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters() if p is not head]
    # every linear layer's tensors in half the bytes; the tied output layer a new bfloat16 copy beside the float32
    # embedding it shared
    expected = total - sum(p.numel() * 2 for p in linear) + head.numel() * 2
    assert converted_mib == pytest.approx(total / 2**20, abs=5e-4)
    assert stored_mib == pytest.approx(expected / 2**20, abs=5e-4)
    assert "same bits: yes" in done.stdout


def test_the_kv_cache_benchmark_decodes_from_the_cache_type_it_names(monkeypatch):
    """The float32-cache contender's caches are float32 under autocast, the engine's are bfloat16, and the script
    prints every contender with the ratio of the two caches."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kv_cache_precision
    from tokenbalance.rollout import layers

    weight = torch.zeros(2, 2)
    layer = layers.LayerWeights(*([None] * 11), num_heads=2, num_kv_heads=1, head_dim=4, scaling=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert {t.dtype for t in layers.empty_cache(2, 3, layer, weight)} == {torch.bfloat16}
        with kv_cache_precision.float32_cache():
            assert {t.dtype for t in layers.empty_cache(2, 3, layer, weight)} == {torch.float32}
        assert {t.dtype for t in layers.empty_cache(2, 3, layer, weight)} == {torch.bfloat16}  # restored
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "kv_cache_precision.py"), "--shape", "tiny", "--batch", "4"]
        + ["--group-size", "2", "--prompt-len", "8", "--new-tokens", "6", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[0].strip().split(",")[0] for row in rows[1:]] == ["float32", "bfloat16 autocast", "bfloat16 autocast"]
    assert all(int(row[1].strip()) == 4 * 6 for row in rows[1:])  # every row decodes the full budget
    assert done.stdout.strip().splitlines()[-1].startswith("bfloat16 K/V cache / float32 K/V cache under autocast: ")
