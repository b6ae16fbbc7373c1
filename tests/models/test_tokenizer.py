import pytest
from transformers import AutoTokenizer

from tests.models.helpers import kk_tokenizer
from tokenbalance.models import EOS_TOKEN, PAD_TOKEN, REASONING_TAGS, train_tokenizer
from tokenbalance.tasks.kk import compute_score, generate_rows, response_text


@pytest.fixture(scope="module")
def tokenizer():
    return kk_tokenizer()


@pytest.fixture(scope="module")
def kk_texts():
    """Unseen rows (test split, 2..4 people): prompt + response + EOS, and the ground truths."""
    rows = [row for n in (2, 3, 4) for row in generate_rows(n, "test", count=15, template="plain")]
    return [(row["prompt"][0]["content"] + response_text(row), row) for row in rows]


def test_decode_encode_is_exact_on_kk_prompts_and_answers(tokenizer, kk_texts):
    for text, _ in kk_texts:
        ids = tokenizer.encode(text + EOS_TOKEN, add_special_tokens=False)
        assert tokenizer.decode(ids) == text + EOS_TOKEN
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_decoded_kk_response_scores_full_reward(tokenizer, kk_texts):
    for text, row in kk_texts[:10]:
        decoded = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
        assert compute_score(decoded, row["reward_model"]["ground_truth"]) == 3.0


def test_awkward_text_round_trips(tokenizer):
    awkward = ["  two spaces", "tab\there\n\n", "ünïcödé ✓ 漢字", "<think><think></answer>x", "a<|im_end|>b", ""]
    for text in awkward:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_tags_are_single_non_special_tokens(tokenizer):
    ids = [tokenizer.encode(tag, add_special_tokens=False) for tag in REASONING_TAGS]
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == 4
    text = " <think> x </think>\n<answer> y </answer>"
    encoded = tokenizer.encode(text, add_special_tokens=False)
    assert {i[0] for i in ids} <= set(encoded)
    assert tokenizer.decode(encoded, skip_special_tokens=True) == text  # tags are kept


def test_special_tokens_and_padding(tokenizer):
    assert tokenizer.pad_token == PAD_TOKEN and tokenizer.pad_token_id == 0
    assert tokenizer.eos_token == EOS_TOKEN and tokenizer.eos_token_id == 1
    assert tokenizer.padding_side == "left"
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [2, 3]
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)
    batch = tokenizer(["a", "a b c d"], padding=True)
    assert batch["input_ids"][0][0] == 0 and batch["attention_mask"][0][0] == 0  # left padded


def test_vocab_size_is_respected():
    texts = ["the knight and the knave said something"] * 50
    small = train_tokenizer(texts, vocab_size=270)
    assert len(small) == 270
    with pytest.raises(ValueError, match=r"vocab_size: must be an integer in \[264, inf\]"):
        train_tokenizer(texts, vocab_size=100)


def test_save_load_round_trip_gives_identical_ids(tokenizer, kk_texts, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert len(loaded) == len(tokenizer)
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.padding_side) == (0, 1, "left")
    for text, _ in kk_texts[:10]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert loaded.encode(text, add_special_tokens=False) == ids
        assert loaded.decode(ids) == text
