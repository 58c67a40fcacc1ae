"""Tokenizer kinds through the bundle: a RoBERTa-style byte-level BPE and a SentencePiece-style Unigram teacher tokenizer.

Each tokenizer is trained offline on a few hundred Rotten Tomatoes sentences and saved as a transformers
save_pretrained folder. The whole pipeline runs with each in tests/test_families.py (the RoBERTa teacher with
the BPE one, the DeBERTa-v3 teacher with the Unigram one), which calls ``check_bundle_for_tokenizer_kind``
here: the bundle must record the special tokens by role, describe the tokenizer it really ships, trim the
vocabulary with the same predictions on test texts whose pieces survive; predict.py must reproduce the recorded
accuracy (checked there for every family).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.data import rotten_tomatoes_path
from pipeline.export.files import BUNDLE_TEMPLATES
from pipeline.export.tokenizer import tokenize_texts, tokenizer_facts, tokenizer_files
from tests.helpers import read_json


def corpus(n: int = 600) -> list[str]:
    frame = pd.read_csv(rotten_tomatoes_path())
    return [str(text) for text in frame["text"].tolist()[:n]]


def save_folder(tokenizer, folder: Path, **specials) -> None:
    """A tokenizer saved on its own with save_pretrained (tokenizer files only, no model config)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **specials)
    fast.save_pretrained(folder)


def byte_level_bpe(folder: Path) -> dict:
    """RoBERTa style: byte-level BPE, <s> text </s>, specials <s> <pad> </s> <unk> <mask> (ids 0..4)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        corpus(),
        trainers.BpeTrainer(
            vocab_size=800,
            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>"))
    )
    save_folder(
        tokenizer,
        folder,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    return {
        "model": "BPE",
        "template": "<s> text </s>",
        "roles": {
            "cls": ("<s>", 0),
            "pad": ("<pad>", 1),
            "sep": ("</s>", 2),
            "unk": ("<unk>", 3),
            "mask": ("<mask>", 4),
        },
    }


def unigram_metaspace(folder: Path) -> dict:
    """SentencePiece style: NFKC + lower-case, Metaspace, Unigram, [CLS] text [SEP], pad/unk/mask named <pad> <unk> <mask>."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(
        corpus(),
        trainers.UnigramTrainer(
            vocab_size=600, special_tokens=["<pad>", "<unk>", "[CLS]", "[SEP]", "<mask>"], unk_token="<unk>"
        ),
    )
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    save_folder(
        tokenizer,
        folder,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    return {
        "model": "Unigram",
        "template": "[CLS] text [SEP]",
        "roles": {
            "pad": ("<pad>", 0),
            "unk": ("<unk>", 1),
            "cls": ("[CLS]", 2),
            "sep": ("[SEP]", 3),
            "mask": ("<mask>", 4),
        },
    }


KINDS = {"byte_level_bpe": byte_level_bpe, "unigram_metaspace": unigram_metaspace}


def check_bundle_for_tokenizer_kind(kind: str, folder: Path, expected: dict, run_dir: Path, output: str) -> None:
    """The bundle of a whole run whose teacher uses the tokenizer ``KINDS[kind]`` wrote to ``folder`` (returning
    ``expected``), run with export.trim_vocab=true; ``output`` is the run's stdout + stderr.

    The runs are the model-family runs of tests/test_families.py (RoBERTa: byte-level BPE, DeBERTa-v3: Unigram),
    so each tokenizer kind goes through the whole pipeline once, with a teacher of the family that ships it."""
    bundle = run_dir / "export" / "bundle"
    metadata = read_json(bundle / "metadata.json")
    tok = metadata["tokenizer"]

    # special tokens by role, with the ids the tokenizer really uses
    assert tok["type"] == expected["model"]
    assert {role: (e["token"], e["id"]) for role, e in tok["special_tokens"].items()} == expected["roles"]
    assert tok["template"] == expected["template"]
    shipped = tokenize_texts(bundle / "tokenizer.json", ["a fine film"], metadata["max_length"])[0]
    assert shipped[0] == expected["roles"]["cls"][1] and shipped[-1] == expected["roles"]["sep"][1]

    # trimmed to the pieces the training text uses: test texts whose pieces all survive get the same ids
    # (tests/test_vocab_trim.py), so the same predictions
    trim = metadata["vocab_trim"]
    full_vocab = len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])
    assert trim["applied"] is True and trim["tokenizer_model"] == expected["model"]
    assert tok["vocab_size"] == trim["kept_tokens"] < full_vocab
    assert trim["test_texts_surviving"] > 0 and trim["surviving_prediction_agreement"] == 1.0
    assert trim["surviving_max_abs_logit_diff"] <= 1e-5
    assert f"vocabulary trimmed to {trim['kept_tokens']} tokens" in output

    # files: no vocab.txt for non-WordPiece; metadata and README list what is there
    files = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()}  # demo/ files included
    assert "vocab.txt" not in files and tok["files"] == ["tokenizer.json"]
    assert set(metadata["files"]) == files - {"metadata.json"}
    readme = (bundle / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Files", 1)[1].split("Check the download", 1)[0]
    listed = {
        cell.strip("` ")
        for line in table.splitlines()
        if line.startswith("| `")
        for cell in line.split("|")[1].split(",")
    }
    assert listed == files

    # the README describes the shipped tokenizer and its real special tokens
    prose = "".join(readme.split("```")[0::2])  # outside code blocks (code may pass None, e.g. session.run(None, ...))
    assert "None" not in prose and "{{" not in readme
    section = readme.split("## 1. Tokenize", 1)[1].split("## 2.", 1)[0].strip()
    assert expected["model"] in section.splitlines()[0] and not section.startswith("WordPiece")
    for token, token_id in expected["roles"].values():
        assert f"`{token}` = {token_id}" in readme
    cls, sep = expected["roles"]["cls"][0], expected["roles"]["sep"][0]
    assert readme.count(f"// ids: {cls} ... {sep}") == 2  # Kotlin and Swift sketches
    assert f"`{expected['template']}`" in readme and f"trimmed to the {trim['kept_tokens']} tokens" in readme
    assert "use this bundle's tokenizer.json, never the original model's vocabulary" in readme
    if kind == "byte_level_bpe":
        assert "byte-level" in readme and "merges" in readme and "**cased**" in readme
    else:
        assert "NFKC" in readme and "lower-case" in readme and "Viterbi" in readme and "\u2581" in readme


def test_predict_reads_the_pad_id_by_role_or_the_older_key():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bundle_predict", BUNDLE_TEMPLATES / "predict.py")
    predict = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(predict)
    pad_token_id = predict.pad_token_id
    assert (
        pad_token_id({"special_tokens": {"pad": {"token": "<pad>", "id": 1}}, "special_token_ids": {"<pad>": 1}}) == 1
    )
    assert pad_token_id({"special_token_ids": {"[PAD]": 0, "[CLS]": 101}}) == 0  # bundles written before roles


def test_wordpiece_facts_keep_the_old_keys_and_add_roles(tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "film", "##s"])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    facts = tokenizer_facts(tmp_path / "tokenizer.json")  # no tokenizer_config.json: roles from the template and names
    assert facts["special_token_ids"] == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    assert {r: e["id"] for r, e in facts["special_tokens"].items()} == {
        "cls": 2,
        "sep": 3,
        "pad": 0,
        "unk": 1,
        "mask": 4,
    }
    assert facts["template"] == "[CLS] text [SEP]" and facts["pair_template"] == "[CLS] text [SEP] text_pair [SEP]"
    assert facts["lowercase"] is True and tokenizer_files(facts) == ["tokenizer.json", "vocab.txt"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_augmentation_finds_whole_words_for_every_tokenizer_kind(kind, tmp_path):
    """Word spans and replacement candidates follow the tokenizer's own word marker ('##' continues a word;
    'Ġ' and '▁' start one), so masking, swaps and span cuts work on words, not pieces."""
    from transformers import AutoTokenizer

    from pipeline.augment import continuation_mask, word_candidates, word_spans

    KINDS[kind](tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    sentence = "a gripping and beautifully acted performance overall"
    ids = tokenizer(sentence)["input_ids"]
    continuation = continuation_mask(tokenizer)
    spans = word_spans(ids, continuation)
    words = [tokenizer.decode(ids[start:end]).strip() for start, end in spans]
    assert words == sentence.split()
    assert any(end - start > 1 for start, end in spans), "the sentence should hold a word of several pieces"
    candidates = set(word_candidates(tokenizer, [ids]).tolist())
    one_piece = [
        ids[start]
        for start, end in spans
        if end - start == 1
        and tokenizer.decode([ids[start]]).strip().isalpha()
        and len(tokenizer.decode([ids[start]]).strip()) > 1
    ]
    assert one_piece and set(one_piece) <= candidates
    assert not candidates & set(tokenizer.all_special_ids)
