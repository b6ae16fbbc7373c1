import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.models.helpers import kk_tokenizer, tiny_model
from tokenbalance.models import check_special_tokens, load_policy, save_policy

IDS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved tiny qwen2 policy, and its logits on IDS."""
    model, tokenizer = tiny_model("qwen2", seed=3), kk_tokenizer()
    path = save_policy(model, tokenizer, tmp_path_factory.mktemp("policies") / "policy")
    with torch.no_grad():
        return path, model(IDS).logits


def copy_policy(saved, tmp_path, *, drop=(), edit_tokenizer_config=None):
    path = tmp_path / "copy"
    shutil.copytree(saved[0], path)
    for name in drop:
        (path / name).unlink()
    if edit_tokenizer_config is not None:
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        edit_tokenizer_config(config)
        config_file.write_text(json.dumps(config))
    return path


def test_round_trip_gives_identical_logits(saved):
    path, logits = saved
    model, tokenizer = load_policy(path)
    assert type(model).__name__ == "Qwen2ForCausalLM" and not model.training
    assert model.dtype == torch.float32
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, len(tokenizer)) == (0, 1, 512)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, logits)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_round_trip_keeps_the_tokenizer_exactly(arch, tmp_path):
    """transformers' AutoTokenizer would load a qwen2 directory as Qwen2Tokenizer (NFC + Qwen regex)."""
    tokenizer = kk_tokenizer()
    _, loaded = load_policy(save_policy(tiny_model(arch), tokenizer, tmp_path / "policy"))
    assert type(loaded) is type(tokenizer)
    assert loaded.backend_tokenizer.normalizer is None
    for text in ["e\u0301 caf\u00e9", "A is a knight's 12345 friend,\r\n  ok", "<think> x </think>\n<answer>"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids
        assert loaded.decode(ids) == text


def test_dtype_and_attention_options(saved):
    model, _ = load_policy(saved[0], dtype=torch.bfloat16, attn_implementation="eager")
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"


def test_saves_safetensors_with_all_files(saved):
    names = {p.name for p in saved[0].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(name.endswith(".bin") for name in names)
    assert "model.embed_tokens.weight" in load_file(saved[0] / "model.safetensors")


def test_atomic_save_replaces_existing_dir_and_leaves_no_temp_dirs(tmp_path):
    tokenizer, target = kk_tokenizer(), tmp_path / "policy"
    save_policy(tiny_model("llama", seed=1), tokenizer, target)
    (target / "stale.txt").write_text("from the old policy")
    save_policy(tiny_model("llama", seed=2), tokenizer, target)
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]
    assert not (target / "stale.txt").exists()
    loaded, expected = load_policy(target)[0].state_dict(), tiny_model("llama", seed=2).state_dict()
    assert all(torch.equal(loaded[name], expected[name]) for name in expected)


def test_failed_save_keeps_the_old_policy_and_cleans_up(tmp_path, monkeypatch):
    tokenizer, target = kk_tokenizer(), tmp_path / "policy"
    save_policy(tiny_model("llama", seed=1), tokenizer, target)
    before = sorted(p.name for p in target.iterdir())

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    model = tiny_model("llama", seed=2)
    monkeypatch.setattr(model, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_policy(model, tokenizer, target)
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]
    assert sorted(p.name for p in target.iterdir()) == before


def test_save_refuses_to_replace_a_file(tmp_path):
    (tmp_path / "policy").write_text("not a directory")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        save_policy(tiny_model(), kk_tokenizer(), tmp_path / "policy")


@pytest.mark.parametrize("path", ["Qwen/Qwen2.5-3B", "no/such-dir"])
def test_hub_ids_are_refused(path):
    with pytest.raises(ValueError, match="must be a local directory.*hub are not supported.*looks like a hub id"):
        load_policy(path)


def test_missing_dir_and_file_are_refused(tmp_path):
    with pytest.raises(ValueError, match="must be a local directory"):
        load_policy(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="must be a local directory"):
        load_policy(tmp_path / "file")


@pytest.mark.parametrize(
    "drop, message",
    [
        (("config.json",), "missing config.json"),
        (("model.safetensors",), r"missing weights \(no \*.safetensors or pytorch_model.bin\)"),
        (("tokenizer.json",), "missing tokenizer files"),
    ],
)
def test_missing_files_are_named(saved, tmp_path, drop, message):
    with pytest.raises(ValueError, match=message):
        load_policy(copy_policy(saved, tmp_path, drop=drop))


def test_pickle_only_weights_are_refused_unless_allowed(saved, tmp_path):
    path = copy_policy(saved, tmp_path, drop=("model.safetensors",))
    model = tiny_model("qwen2", seed=3)
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="only pickle weights.*refusing to unpickle.*allow_pickle=True"):
        load_policy(path)
    loaded, _ = load_policy(path, allow_pickle=True)
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, saved[1], atol=0, rtol=0)


def test_tokenizer_without_pad_token_is_refused_or_fixed(saved, tmp_path):
    path = copy_policy(saved, tmp_path, edit_tokenizer_config=lambda c: c.pop("pad_token"))
    expected = r"no pad token; add one to its tokenizer_config\.json .*load_policy\(\.\.\., pad_token=\.\.\.\)"
    with pytest.raises(ValueError, match=expected):
        load_policy(path)
    _, tokenizer = load_policy(path, pad_token="<|endoftext|>")
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 1


def test_tokenizer_without_eos_token_is_refused(saved, tmp_path):
    path = copy_policy(saved, tmp_path, edit_tokenizer_config=lambda c: c.pop("eos_token"))
    with pytest.raises(ValueError, match="no eos token"):
        load_policy(path)


def test_tokenizer_larger_than_embedding_is_refused(saved, tmp_path):
    path = copy_policy(saved, tmp_path)
    _, tokenizer = load_policy(path)
    tokenizer.add_tokens(["<extra_1>", "<extra_2>"])
    tokenizer.save_pretrained(path)
    with pytest.raises(ValueError, match="tokenizer has 514 tokens but the model's embedding only 512 rows"):
        load_policy(path)


def test_check_special_tokens():
    tokenizer = kk_tokenizer()
    ids = check_special_tokens(tokenizer, single_token=True)
    assert ids == {tag: [tokenizer.convert_tokens_to_ids(tag)] for tag in ids}
    ids = check_special_tokens(tokenizer, ["<tool>", "</think>"])  # round-trips as pieces
    assert len(ids["<tool>"]) > 1
    with pytest.raises(ValueError, match="these tags are not single tokens: <tool>$"):
        check_special_tokens(tokenizer, ["<tool>", "</think>"], single_token=True)


def test_check_special_tokens_names_tags_that_do_not_round_trip():
    tokenizer = kk_tokenizer()
    tokenizer.add_special_tokens({"extra_special_tokens": ["<secret>"]})
    # a special token round-trips only when not skipped; emulate a lossy tokenizer instead:
    lossy = type(
        "Lossy",
        (),
        {
            "encode": lambda self, text, add_special_tokens=False: tokenizer.encode(text, add_special_tokens=False),
            "decode": lambda self, ids, **kw: tokenizer.decode(ids, **kw).replace("</answer>", ""),
        },
    )()
    with pytest.raises(ValueError, match="does not round-trip these tags: </answer>$"):
        check_special_tokens(lossy)
