"""The static student (pipeline/static_model.py): its forward and its initialisation against naive versions,
vocabulary trimming, save/load and ONNX parity, and the config's refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from transformers import BertConfig, BertModel

from pipeline.config import load_config
from pipeline.errors import ConfigError
from pipeline.export.onnx_graph import OUTPUT_NAMES, LogitsOnly, export_onnx, ort_session
from pipeline.export.quantize import quantization_ladder
from pipeline.export.tokenizer import trim_embeddings
from pipeline.models import load_classifier
from pipeline.static_model import (
    BIGRAM_PRIME,
    StaticEmbeddingConfig,
    StaticEmbeddingForSequenceClassification,
    context_vectors,
    pca,
    sif_weights,
    static_table,
    token_vectors,
)


def random_static(vocab=50, dim=8, labels=3, seed=0, bigram_buckets=0, pooling="mean", head_hidden=0):
    torch.manual_seed(seed)
    model = StaticEmbeddingForSequenceClassification(
        StaticEmbeddingConfig(
            vocab_size=vocab,
            hidden_size=dim,
            num_labels=labels,
            bigram_buckets=bigram_buckets,
            pooling=pooling,
            head_hidden=head_hidden,
        )
    )
    with torch.no_grad():
        model.token_weights.weight.normal_(0, 1)  # non-uniform pooling weights, or the test cannot see them
        if bigram_buckets:
            model.bigrams.weight.normal_(0, 1)  # the table starts at zero; trained, it is not
    return model.eval()


def norm(weights: list, pooling: str):
    """What the weighted sum of a text's vectors is divided by: the sum of the weights (a weighted mean) or, with
    sqrtn, the root of the sum of their squares."""
    return sum(weights) if pooling == "mean" else sum(w * w for w in weights) ** 0.5


@pytest.mark.parametrize("pooling", ["mean", "sqrtn"])
def test_forward_is_the_weighted_mean_of_token_vectors_then_the_head(pooling):
    model = random_static(pooling=pooling)
    ids = torch.tensor([[3, 7, 7, 12, 0, 0], [5, 9, 1, 2, 44, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    logits = model(input_ids=ids, attention_mask=mask).logits
    E, w = model.embeddings.weight.detach(), model.token_weights.weight.detach()[:, 0].exp()
    for row in range(2):
        tokens = [int(t) for t, m in zip(ids[row], mask[row]) if m]
        pooled = sum(w[t] * E[t] for t in tokens) / norm([w[t] for t in tokens], pooling)
        expected = pooled @ model.classifier.weight.detach().T + model.classifier.bias.detach()
        torch.testing.assert_close(logits[row], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling", ["mean", "sqrtn"])
def test_bigrams_add_the_mean_vector_of_the_hashed_neighbouring_pairs(pooling):
    model = random_static(bigram_buckets=13, pooling=pooling)
    ids = torch.tensor([[3, 7, 7, 12, 0, 0], [5, 9, 1, 2, 44, 8], [6, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    logits = model(input_ids=ids, attention_mask=mask).logits
    E, w, B = model.embeddings.weight.detach(), model.token_weights.weight.detach()[:, 0].exp(), model.bigrams.weight
    for row in range(3):
        tokens = [int(t) for t, m in zip(ids[row], mask[row]) if m]
        pooled = sum(w[t] * E[t] for t in tokens) / norm([w[t] for t in tokens], pooling)
        pairs = [B[(a * BIGRAM_PRIME + b) % 13].detach() for a, b in zip(tokens, tokens[1:])]
        if pairs:  # a one-token text has no pair: the unigram model's vector
            pooled = pooled + sum(pairs) / norm([1.0] * len(pairs), pooling)
        expected = pooled @ model.classifier.weight.detach().T + model.classifier.bias.detach()
        torch.testing.assert_close(logits[row], expected, rtol=1e-5, atol=1e-6)


def test_a_hidden_layer_reads_the_pooled_vector_through_a_relu():
    model = random_static(dim=8, labels=3, bigram_buckets=13, pooling="sqrtn", head_hidden=5)
    ids = torch.tensor([[3, 7, 7, 12, 0, 0], [5, 9, 1, 2, 44, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    logits = model(input_ids=ids, attention_mask=mask).logits
    E, w, B = model.embeddings.weight.detach(), model.token_weights.weight.detach()[:, 0].exp(), model.bigrams.weight
    first, last = model.classifier[0], model.classifier[2]
    assert first.weight.shape == (5, 8) and last.weight.shape == (3, 5)
    for row in range(2):
        tokens = [int(t) for t, m in zip(ids[row], mask[row]) if m]
        pooled = sum(w[t] * E[t] for t in tokens) / norm([w[t] for t in tokens], "sqrtn")
        pooled = pooled + sum(B[(a * BIGRAM_PRIME + b) % 13].detach() for a, b in zip(tokens, tokens[1:])) / norm(
            [1.0] * (len(tokens) - 1), "sqrtn"
        )
        hidden = torch.clamp(pooled @ first.weight.detach().T + first.bias.detach(), min=0)
        expected = hidden @ last.weight.detach().T + last.bias.detach()
        torch.testing.assert_close(logits[row], expected, rtol=1e-5, atol=1e-6)
    # He-scaled hidden layer: its ReLU outputs are not ~0 at the start (they would be at the output layer's 0.02)
    assert 0.3 < float(first.weight.detach().std()) * 8**0.5 < 3


@pytest.mark.parametrize("head_hidden", [0, 6])
def test_folding_the_first_layer_keeps_the_logits(head_hidden):
    model = random_static(dim=8, labels=3, bigram_buckets=13, head_hidden=head_hidden)
    with torch.no_grad():
        model.classifier.apply(lambda m: m.bias.normal_(0, 1) if isinstance(m, torch.nn.Linear) else None)
    ids = torch.tensor([[3, 7, 7, 12, 0, 0], [5, 9, 1, 2, 44, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    before = model(input_ids=ids, attention_mask=mask).logits
    model.fold_classifier()
    assert model.embeddings.embedding_dim == (head_hidden or 3) and model.bigrams.embedding_dim == (head_hidden or 3)
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, before, rtol=1e-5, atol=1e-5)


def test_a_new_bigram_table_is_zero_so_the_model_starts_as_the_unigram_one():
    torch.manual_seed(0)
    config = dict(vocab_size=30, hidden_size=4, num_labels=2)
    with_pairs = StaticEmbeddingForSequenceClassification(StaticEmbeddingConfig(**config, bigram_buckets=7))
    assert with_pairs.bigrams.weight.abs().max() == 0
    plain = StaticEmbeddingForSequenceClassification(StaticEmbeddingConfig(**config))
    plain.load_state_dict({k: v for k, v in with_pairs.state_dict().items() if k not in ("bigrams.weight", "hash_ids")})
    ids = torch.tensor([[1, 5, 9, 2]])
    torch.testing.assert_close(with_pairs(input_ids=ids).logits, plain(input_ids=ids).logits)


@pytest.mark.parametrize("bigram_buckets, pooling", [(0, "mean"), (11, "mean"), (11, "sqrtn")])
def test_padding_does_not_change_the_logits(bigram_buckets, pooling):
    model = random_static(bigram_buckets=bigram_buckets, pooling=pooling)
    alone = model(input_ids=torch.tensor([[4, 8, 15]]), attention_mask=torch.ones(1, 3, dtype=torch.long)).logits
    padded = model(
        input_ids=torch.tensor([[4, 8, 15, 0, 0, 0, 0]]), attention_mask=torch.tensor([[1, 1, 1, 0, 0, 0, 0]])
    ).logits
    torch.testing.assert_close(alone, padded)


def test_pca_matches_the_covariance_eigenvectors():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6))
    ours = pca(x, 3)
    centred = x - x.mean(0)
    values, vectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    naive = centred @ vectors[:, np.argsort(values)[::-1][:3]]
    np.testing.assert_allclose(np.abs(ours), np.abs(naive), atol=1e-8)  # axes agree up to sign
    assert np.all(np.abs(ours).max(0) > 0)
    with pytest.raises(ValueError, match="PCA width 7"):
        pca(x, 7)


def test_sif_weights_and_context_means():
    counts = np.array([0.0, 1.0, 9.0])
    np.testing.assert_allclose(sif_weights(counts, a=0.1), 0.1 / (0.1 + counts / 10))
    isolated = np.arange(12, dtype=np.float64).reshape(3, 4)
    sums = np.ones((3, 4)) * np.array([[0.0], [5.0], [90.0]])
    vectors, log_weights = static_table(isolated, sums, counts, dim=2)
    # token 0 was never seen: its isolated vector; tokens 1, 2: the means of their contexts (5/1 and 90/9)
    expected = pca(np.stack([isolated[0], np.full(4, 5.0), np.full(4, 10.0)]), 2)
    expected /= np.linalg.norm(expected, axis=1).mean()
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.exp(log_weights), sif_weights(counts), rtol=1e-6)


def test_token_and_context_vectors_read_the_encoder():
    torch.manual_seed(0)
    encoder = BertModel(
        BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    ).eval()
    vectors = token_vectors(encoder, 30, cls_id=1, sep_id=2, batch_size=7)
    with torch.no_grad():
        one = encoder(input_ids=torch.tensor([[1, 11, 2]])).last_hidden_state[0, 1]
    np.testing.assert_allclose(vectors[11], one.numpy(), rtol=1e-5, atol=1e-6)
    batch = {
        "input_ids": torch.tensor([[1, 5, 5, 2], [1, 5, 2, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
    }
    sums, counts = context_vectors(encoder, [batch], 30, 16)
    with torch.no_grad():
        out = encoder(**batch).last_hidden_state
    assert counts[5] == 3 and counts[0] == 0  # padding is not counted
    np.testing.assert_allclose(sums[5], (out[0, 1] + out[0, 2] + out[1, 1]).double().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bigram_buckets", [0, 11])
def test_trimming_keeps_both_tables_and_the_predictions(bigram_buckets):
    model = random_static(vocab=50, bigram_buckets=bigram_buckets)
    ids = torch.tensor([[3, 7, 7, 12], [5, 9, 1, 2]])
    before = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    kept = [0, 1, 2, 3, 5, 7, 9, 12]
    trim_embeddings(model, kept)
    assert model.embeddings.num_embeddings == model.token_weights.num_embeddings == model.config.vocab_size == len(kept)
    remapped = torch.tensor([[kept.index(int(t)) for t in row] for row in ids])
    after = model(input_ids=remapped, attention_mask=torch.ones_like(remapped)).logits
    torch.testing.assert_close(before, after)


@pytest.mark.parametrize("bigram_buckets, pooling", [(0, "mean"), (11, "mean"), (11, "sqrtn")])
def test_saves_loads_and_exports_like_any_student(tmp_path, bigram_buckets, pooling):
    model = random_static(vocab=40, dim=8, labels=2, bigram_buckets=bigram_buckets, pooling=pooling)
    model.config.id2label, model.config.label2id = {0: "a", 1: "b"}, {"a": 0, "b": 1}
    model.save_pretrained(tmp_path / "student")
    loaded = load_classifier(str(tmp_path / "student")).eval()
    assert type(loaded) is StaticEmbeddingForSequenceClassification and loaded.config.pooling == pooling
    ids = torch.tensor([[2, 3, 4, 0], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    expected = model(input_ids=ids, attention_mask=mask).logits.detach().numpy()
    np.testing.assert_array_equal(loaded(input_ids=ids, attention_mask=mask).logits.detach().numpy(), expected)
    export_onnx(LogitsOnly(loaded), tmp_path / "static.onnx", 18)
    got = ort_session(tmp_path / "static.onnx").run(
        OUTPUT_NAMES, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    )[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bigram_buckets, pooling", [(0, "mean"), (11, "mean"), (11, "sqrtn")])
def test_folding_the_head_into_the_tables_keeps_the_logits_and_leaves_no_matrix_product(
    tmp_path, bigram_buckets, pooling
):
    """export folds the head into the tables (W v_t per token, W b_p per pair): the same logits, padded or not,
    before and after vocabulary trimming, from tables of num_labels columns, and an ONNX graph without MatMul."""
    model = random_static(vocab=50, dim=8, labels=3, bigram_buckets=bigram_buckets, pooling=pooling)
    ids = torch.tensor([[3, 7, 7, 12, 0], [5, 9, 1, 2, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    before = model(input_ids=ids, attention_mask=mask).logits
    model.fold_classifier()
    assert model.embeddings.embedding_dim == 3 and (not bigram_buckets or model.bigrams.embedding_dim == 3)
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, before, rtol=1e-5, atol=1e-6)
    kept = [0, 1, 2, 3, 4, 5, 7, 9, 12]
    trim_embeddings(model, kept)
    remapped = torch.tensor([[kept.index(int(t)) for t in row] for row in ids])
    torch.testing.assert_close(model(input_ids=remapped, attention_mask=mask).logits, before, rtol=1e-5, atol=1e-6)
    export_onnx(LogitsOnly(model), tmp_path / "folded.onnx", 18)
    assert not [n for n in onnx.load(tmp_path / "folded.onnx").graph.node if n.op_type in ("MatMul", "Gemm")]
    # no weight MatMul left: the int8 ladder is the embedding-table settings (it used to be empty, and the export failed)
    assert [s["name"] for s in quantization_ladder(tmp_path / "folded.onnx", 0)] == [
        "per_channel_embeddings",
        "per_channel_embeddings_reduce_range",
    ]
    got = ort_session(tmp_path / "folded.onnx").run(
        OUTPUT_NAMES, {"input_ids": remapped.numpy(), "attention_mask": mask.numpy()}
    )[0]
    np.testing.assert_allclose(got, before.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_torch_export_takes_the_bigram_student_from_two_tokens():
    """The ExecuTorch programs are exported with a sequence axis from 2 tokens ([CLS] [SEP]) up: the pairs are a
    rotation of the ids, not a one-shorter slice, which torch.export refused ("Constraints violated (sequence)": it
    wanted 3 tokens at least), so the bigram student shipped no .pte."""
    model = random_static(vocab=50, dim=8, labels=2, bigram_buckets=11)
    ids, mask = torch.tensor([[2, 9, 4, 7, 3]]), torch.ones(1, 5, dtype=torch.long)
    sequence = torch.export.Dim("sequence", min=2, max=64)
    exported = torch.export.export(
        LogitsOnly(model), (ids, mask), dynamic_shapes=({1: sequence}, {1: sequence}), strict=False
    ).module()
    for length in (2, 3, 5):
        expected = model(input_ids=ids[:, :length], attention_mask=mask[:, :length]).logits
        torch.testing.assert_close(exported(ids[:, :length], mask[:, :length]), expected)


def test_config_refuses_what_a_static_student_cannot_do():
    with pytest.raises(ConfigError) as caught:
        load_config("bert_small", ["student.kind=static", "student.ffn_size=null"])
    message = str(caught.value)
    assert "distill.loss.attention=0" in message and "distill.loss.value_relation=0" in message
    with pytest.raises(ConfigError, match="student.ffn_size"):
        load_config("bert_small", ["student.kind=static", "distill.loss.attention=0", "distill.loss.value_relation=0"])
    config = load_config(
        "bert_small",
        ["student.kind=static", "student.ffn_size=null", "distill.loss.attention=0", "distill.loss.value_relation=0"],
    )
    assert config.student_depth() == 0
