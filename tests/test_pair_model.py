"""The token-pair student (pipeline/pair_model.py): its input vectors against a naive version, the conversion from a
BERT student, save/load, vocabulary trimming, ONNX and torch.export parity, and build_student's refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline.config import load_config
from pipeline.errors import ConfigError, ModelError
from pipeline.export import executorch_program
from pipeline.export.onnx_graph import OUTPUT_NAMES, LogitsOnly, export_onnx, ort_session
from pipeline.export.tokenizer import trim_embeddings
from pipeline.models import build_student, check_against_models, load_classifier, remap_embeddings
from pipeline.pair_model import BertPairsConfig, BertPairsForSequenceClassification, with_token_pairs
from pipeline.static_model import BIGRAM_PRIME
from pipeline.training import configure_optimizer, configure_scheduler
from tests.helpers import padded_batch
from tests.test_families import family_model

BUCKETS = 13


def random_bert(seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=3,
    )
    return BertForSequenceClassification(config).eval()


def trained_pairs(seed: int = 0) -> BertPairsForSequenceClassification:
    """A converted student whose pair table is not zero (as after training)."""
    model = with_token_pairs(random_bert(seed), BUCKETS).eval()
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.pairs.weight.normal_(0, 1)
    return model


def test_input_vectors_are_the_token_plus_its_hashed_pair_with_the_token_before():
    model = trained_pairs()
    embedding = model.bert.embeddings.word_embeddings
    ids, _ = padded_batch(vocab=60, lowest_id=1)
    got = embedding(ids)
    E, P = embedding.tokens.weight.detach(), embedding.pairs.weight.detach()
    for row in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            expected = E[ids[row, t]].clone()
            if t > 0:  # the first position ([CLS]) has no token before it
                expected += P[(int(ids[row, t - 1]) * BIGRAM_PRIME + int(ids[row, t])) % BUCKETS]
            torch.testing.assert_close(got[row, t], expected)


def test_a_converted_student_starts_with_the_same_logits_and_saves_and_loads(tmp_path):
    bert = random_bert()
    ids, mask = padded_batch(vocab=60, lowest_id=1)
    converted = with_token_pairs(bert, BUCKETS).eval()
    assert converted.config.model_type == "bert-pairs" and converted.config.token_pairs == BUCKETS
    assert not converted.bert.embeddings.word_embeddings.pairs.weight.any()  # zero: it adds nothing yet
    with torch.no_grad():
        torch.testing.assert_close(
            converted(input_ids=ids, attention_mask=mask).logits, bert(input_ids=ids, attention_mask=mask).logits
        )
    model = trained_pairs()
    kept = [0, *range(59, 0, -2)]  # trimmed first, so the ids the pairs hash are no longer the row numbers
    trim_embeddings(model, kept)
    model.save_pretrained(tmp_path / "student")
    loaded = load_classifier(str(tmp_path / "student")).eval()
    assert type(loaded) is BertPairsForSequenceClassification
    assert torch.equal(loaded.bert.embeddings.word_embeddings.hash_ids, torch.tensor(kept))
    ids = ids % len(kept)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=ids, attention_mask=mask).logits, model(input_ids=ids, attention_mask=mask).logits
        )
    with pytest.raises(ValueError, match="token_pairs >= 1"):
        BertPairsForSequenceClassification(BertPairsConfig(vocab_size=10, hidden_size=8, num_attention_heads=2))


def test_trimming_keeps_the_pairs_buckets_and_the_predictions():
    model = trained_pairs()
    ids = torch.tensor([[1, 7, 7, 12, 30, 2], [1, 9, 44, 5, 2, 0]])
    mask = (ids > 0).long()
    mask[0, 0] = 1
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).logits
    kept = [0, 1, 2, 5, 7, 9, 12, 30, 44]
    trim_embeddings(model, kept)
    assert model.get_input_embeddings().num_embeddings == model.config.vocab_size == len(kept)
    remapped = torch.tensor([[kept.index(int(t)) for t in row] for row in ids])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=remapped, attention_mask=mask).logits, before)


def test_a_remapped_vocabulary_keeps_the_pairs_buckets():
    """A pretrained token-pair student whose pieces sit at other ids (vocabulary_remap) reads the teacher's ids with
    the same logits: its pairs hash the ids they were trained on."""
    model = trained_pairs()
    student_ids = torch.tensor([[1, 7, 7, 12, 30, 2], [1, 9, 44, 5, 2, 0]])
    mask = (student_ids > 0).long()
    with torch.no_grad():
        before = model(input_ids=student_ids, attention_mask=mask).logits
    rows = [0, *range(59, 0, -1)]  # teacher id i is the student's row rows[i] (padding stays 0)
    remap_embeddings(model, rows, pad_token_id=0)
    teacher_ids = torch.tensor([[rows.index(int(t)) for t in row] for row in student_ids])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=teacher_ids, attention_mask=mask).logits, before)


def test_onnx_and_torch_export_give_the_same_logits(tmp_path):
    model = trained_pairs()
    ids, mask = padded_batch(vocab=60, lowest_id=1)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    export_onnx(LogitsOnly(model), tmp_path / "pairs.onnx", 18)
    got = ort_session(tmp_path / "pairs.onnx").run(
        OUTPUT_NAMES, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    )[0]
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-5)
    # the ExecuTorch programs: a sequence axis from 2 tokens ([CLS] [SEP]) up
    one, one_mask = ids[:1], mask[:1]
    sequence = torch.export.Dim("sequence", min=2, max=32)
    exported = torch.export.export(
        LogitsOnly(model), (one, one_mask), dynamic_shapes=({1: sequence}, {1: sequence}), strict=False
    ).module()
    for length in (2, 3, 7):
        with torch.no_grad():
            reference = model(input_ids=one[:, :length], attention_mask=one_mask[:, :length]).logits
        torch.testing.assert_close(exported(one[:, :length], one_mask[:, :length]), reference)


def tiny(*overrides: str):
    return load_config("tiny", ["tracking.enabled=false", *overrides])


def test_build_student_converts_a_bert_student_and_refuses_what_it_cannot_do():
    teacher = random_bert()
    student = build_student(tiny("student.teacher_layers=[0,1]", f"student.token_pairs={BUCKETS}"), teacher)
    assert type(student) is BertPairsForSequenceClassification and student.config.token_pairs == BUCKETS
    ids, mask = padded_batch(vocab=60, lowest_id=1)
    with torch.no_grad():  # every teacher layer copied and a zero pair table: the teacher's logits
        torch.testing.assert_close(
            student.eval()(input_ids=ids, attention_mask=mask).logits,
            teacher(input_ids=ids, attention_mask=mask).logits,
            rtol=1e-4,
            atol=1e-5,
        )
    # a student of a token-pair teacher keeps its table; another size would move every pair
    with pytest.raises(ModelError, match="student.token_pairs: 13"):
        build_student(tiny("student.teacher_layers=[0]", "student.token_pairs=7"), trained_pairs())
    kept = build_student(tiny("student.teacher_layers=[0]", f"student.token_pairs={BUCKETS}"), trained_pairs())
    assert kept.bert.embeddings.word_embeddings.pairs.weight.any()
    with pytest.raises(ModelError, match="BERT students only"):
        build_student(tiny("student.teacher_layers=[0]", "student.token_pairs=7"), family_model("roberta"))
    # a random student of a token-pair teacher: a zero table of its own size
    shape = "student.random={num_layers: 1, hidden_size: 16, num_heads: 4, intermediate_size: 32, max_position_embeddings: 32}"
    fresh = build_student(tiny("student.init=random", shape, "student.token_pairs=7"), trained_pairs())
    assert fresh.config.token_pairs == 7 and not fresh.bert.embeddings.word_embeddings.pairs.weight.any()


def test_what_a_token_pair_student_cannot_be_is_refused_before_any_work(tmp_path):
    """check_against_models (before the teacher is trained): another family, or a table of another size."""
    family_model("roberta").config.save_pretrained(tmp_path / "roberta")
    with pytest.raises(ConfigError, match="BERT students only"):
        check_against_models(tiny(f"teacher.model={tmp_path / 'roberta'}", "student.token_pairs=8"))
    trained_pairs().config.save_pretrained(tmp_path / "pairs")
    with pytest.raises(ConfigError, match=f"student.token_pairs: {BUCKETS}"):
        check_against_models(tiny(f"teacher.model={tmp_path / 'pairs'}", "student.token_pairs=8"))
    check_against_models(tiny(f"teacher.model={tmp_path / 'pairs'}", f"student.token_pairs={BUCKETS}"))


def test_the_pair_table_trains_at_its_own_rate_and_the_schedule_scales_both():
    model = trained_pairs()
    config = tiny(f"student.token_pairs={BUCKETS}", "distill.token_pairs_lr=0.01", "distill.lr=0.001")
    optimizer, params = configure_optimizer({"model": model}, config.distill)
    pairs = model.bert.embeddings.word_embeddings.pairs.weight
    (own,) = [group for group in optimizer.param_groups if any(p is pairs for p in group["params"])]
    assert own["lr"] == 0.01 and len(own["params"]) == 1
    others = [group for group in optimizer.param_groups if group is not own]
    assert {group["lr"] for group in others} == {0.001}
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(params) == len(list(model.parameters()))
    scheduler = configure_scheduler(optimizer, config.distill, num_examples=160)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert own["lr"] == pytest.approx(10 * others[0]["lr"]) and 0 < others[0]["lr"] < 0.001
    # without the setting, one rate for all
    plain, _ = configure_optimizer({"model": model}, tiny(f"student.token_pairs={BUCKETS}").distill)
    assert {group["lr"] for group in plain.param_groups} == {tiny().distill.lr}


@pytest.mark.process  # ExecuTorch's serializer runs a tool of its own
def test_the_executorch_program_gives_the_same_logits(tmp_path):
    """The bundle's .pte: the pairs (a rotation of the ids, one Gather) lower to XNNPACK with the rest."""
    model = trained_pairs()
    done = executorch_program.export_pte(model, tmp_path / "pairs.pte", max_length=32)
    assert done["delegate_calls"] >= 1
    run = executorch_program.runner(tmp_path / "pairs.pte")
    for ids in ([1, 7, 7, 12, 30, 2], [1, 44, 2]):
        feeds = {"input_ids": np.array([ids]), "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        np.testing.assert_allclose(run(feeds), expected.logits.numpy(), rtol=1e-4, atol=1e-5)
