import pytest
import torch
from transformers import LlamaForCausalLM, Qwen2ForCausalLM

from tests.models.helpers import kk_tokenizer, tiny_model
from tokenbalance.models import TinyModelConfig, build_tiny_model, count_parameters


def expected_parameter_count(config: TinyModelConfig, vocab: int) -> int:
    """Hand formula. Per layer: q and o (D x D), k and v (D x kv*hd) [+ q/k/v biases for qwen2],
    SwiGLU gate/up/down (3 x D x I), two RMSNorm weights (2D). Plus the embedding (V x D), the
    final norm (D) and an untied LM head (V x D)."""
    d, i, kv_width = config.hidden_size, config.intermediate_size, config.kv_heads * config.head_dim
    attention = 2 * d * d + 2 * d * kv_width
    if config.arch == "qwen2":
        attention += d + 2 * kv_width
    layer = attention + 3 * d * i + 2 * d
    head = 0 if config.tie_word_embeddings else vocab * d
    return config.num_layers * layer + vocab * d + d + head


@pytest.mark.parametrize(
    "config",
    [
        TinyModelConfig(),
        TinyModelConfig(arch="llama", hidden_size=32, num_layers=2, intermediate_size=64),
        TinyModelConfig(arch="qwen2", hidden_size=32, num_layers=2, intermediate_size=64),
        TinyModelConfig(
            arch="qwen2",
            hidden_size=48,
            num_layers=3,
            num_heads=6,
            num_kv_heads=2,
            intermediate_size=40,
            tie_word_embeddings=False,
        ),
        TinyModelConfig(
            arch="llama",
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            num_kv_heads=1,
            intermediate_size=16,
            tie_word_embeddings=False,
        ),
    ],
)
def test_parameter_count_matches_hand_formula(config):
    tokenizer = kk_tokenizer()
    model = build_tiny_model(config, tokenizer)
    assert count_parameters(model) == expected_parameter_count(config, len(tokenizer))


def test_default_config_parameter_count():
    # llama, D=128, 4 layers, I=512, tied, V=1024: 4 * (4*128*128 + 3*128*512 + 2*128) + 1024*128 + 128
    assert expected_parameter_count(TinyModelConfig(), 1024) == 1_180_800


@pytest.mark.parametrize("arch, model_class", [("llama", LlamaForCausalLM), ("qwen2", Qwen2ForCausalLM)])
def test_builds_both_archs_with_token_ids_and_logits_shape(arch, model_class):
    tokenizer = kk_tokenizer()
    model = tiny_model(arch)
    assert type(model) is model_class
    assert model.config.vocab_size == len(tokenizer) == 512
    assert (model.config.pad_token_id, model.config.eos_token_id, model.config.bos_token_id) == (0, 1, 1)
    generation = model.generation_config
    assert (generation.pad_token_id, generation.eos_token_id, generation.bos_token_id) == (0, 1, 1)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied by default
    assert model.config._attn_implementation == "sdpa"
    ids = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])
    assert model(ids).logits.shape == (2, 5, 512)


def test_qwen2_has_qkv_biases_and_llama_none():
    qwen_names = {name for name, _ in tiny_model("qwen2").named_parameters()}
    llama_names = {name for name, _ in tiny_model("llama").named_parameters()}
    assert "model.layers.0.self_attn.k_proj.bias" in qwen_names
    assert not any(name.endswith("bias") for name in llama_names)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_same_seed_same_weights_other_seed_differs(arch):
    torch.manual_seed(123)
    before = torch.rand(3)
    first, second, other = tiny_model(arch, seed=7), tiny_model(arch, seed=7), tiny_model(arch, seed=8)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), before)  # the global RNG was not consumed
    a, b, c = first.state_dict(), second.state_dict(), other.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_eager_and_sdpa_agree():
    tokenizer = kk_tokenizer()
    config = TinyModelConfig(hidden_size=32, num_layers=2, intermediate_size=64)
    eager = build_tiny_model(config, tokenizer, attn_implementation="eager")
    sdpa = build_tiny_model(config, tokenizer, attn_implementation="sdpa")
    assert eager.config._attn_implementation == "eager"
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    torch.testing.assert_close(eager(ids).logits, sdpa(ids).logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="attn_implementation must be one of sdpa, eager"):
        build_tiny_model(config, tokenizer, attn_implementation="flash")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"arch": "gpt2"}, "arch must be one of llama, qwen2, got 'gpt2'"),
        ({"hidden_size": 0}, r"hidden_size: must be an integer in \[1, inf\], got 0"),
        ({"num_layers": 2.5}, r"num_layers: must be an integer in \[1, inf\], got 2.5"),
        ({"hidden_size": 30, "num_heads": 4}, r"hidden_size must be a multiple of num_heads \(4\), got 30"),
        ({"hidden_size": 12, "num_heads": 4}, "head size.*must be even"),
        ({"num_kv_heads": 3}, r"num_kv_heads must be None or a divisor of num_heads \(4\) in 1..4, got 3"),
        ({"num_kv_heads": 0}, "num_kv_heads must be None or a divisor"),
        ({"rope_theta": 0.0}, r"rope_theta: must be in \(0.0, inf\], got 0.0"),
        ({"intermediate_size": -1}, r"intermediate_size: must be an integer in \[1, inf\], got -1"),
        ({"max_position_embeddings": 0}, r"max_position_embeddings: must be an integer in \[1, inf\], got 0"),
    ],
)
def test_config_validation_names_field_and_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        TinyModelConfig(**overrides)


def test_tokenizer_without_pad_is_refused():
    tokenizer = kk_tokenizer()
    tokenizer.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=8), tokenizer)
